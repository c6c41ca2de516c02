"""Streaming statistics of MatMul inputs for GPTQ, AWQ and the scale search.

:class:`Need`, :class:`TensorStats` and :func:`add` are what every calibration path
fills; decoders run one layer at a time (:mod:`.stages`). :func:`collect` is the path for
models that cannot be cut by layer: the whole model in budgeted chunks of tensors.

GPTQ needs each layer's input Hessian, AWQ a sample of its input rows, the scale search
the mean square of each input channel. Holding every layer's activations for every
calibration window would take gigabytes on an LLM, so the statistics are accumulated as
the windows run: the MatMul inputs are made graph outputs of a copy of the model, in
*chunks* whose activations for one batch fit ``budget_bytes``; each chunk runs the
calibration data once, feeds :class:`lpq.weight_only.HessianAccumulator` and keeps at
most ``sample_rows`` rows per tensor, then its outputs are dropped. The sessions run a
*detached* copy (:mod:`lpq_onnxrt.weights`): the weights are held once more, as arrays ORT
reads in place. Peak memory is the model, that one copy of its weights, one batch's
activations of one chunk and the statistics ((K, K) float64 per Hessian).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from lpq import DataError, ModelError
from lpq.weight_only import HessianAccumulator

from ... import weights
from ...data import iter_batches
from ...session import build_session_options, providers

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Need:
    """What one MatMul input tensor (width ``k``) must be summarised into."""

    k: int
    hessian: bool = False
    sample_rows: int = 0
    #: GPTQ's Hessian weighs each sequence's first token as the rest of its sequence
    #: (attention projections: see :func:`add`)
    first_token: bool = False


@dataclass
class TensorStats:
    """The statistics of one tensor over the calibration data."""

    k: int
    hessian: HessianAccumulator | None = None
    sumsq: npt.NDArray[np.float64] | None = None
    count: int = 0
    rows: list[npt.NDArray[np.float32]] = field(default_factory=list)
    #: at most this many rows in :meth:`sample` (0: no limit)
    limit: int = 0

    @classmethod
    def start(cls, need: Need) -> TensorStats:
        """Empty statistics for a tensor that must be summarised as ``need`` says."""
        accumulator = HessianAccumulator(need.k) if need.hessian else None
        return cls(need.k, accumulator, limit=need.sample_rows)

    def importance(self) -> npt.NDArray[np.float64] | None:
        """Mean square of each input channel (the scale search's weighting)."""
        if self.sumsq is None or self.count == 0:
            return None
        return self.sumsq / self.count

    def sample(self) -> npt.NDArray[np.float32]:
        """The kept rows as one (M, K) matrix, at most ``limit`` of them, evenly spread
        (:func:`add` keeps up to twice as many between thinnings; AWQ's search costs one
        (M, K) x (K, N) product per alpha, so the documented ``awq_tokens`` is kept)."""
        if not self.rows:
            return np.zeros((0, self.k), np.float32)
        merged = np.concatenate(self.rows, axis=0)
        if self.limit and len(merged) > self.limit:
            merged = merged[np.linspace(0, len(merged) - 1, self.limit).round().astype(int)]
        return merged


def add(stats: TensorStats, need: Need, value: np.ndarray) -> None:
    """Fold one batch's ``value`` of the tensor into ``stats``. With ``need.first_token``,
    a batch of sequences ``(batch, S, K)`` weighs each sequence's first token (a decoder's
    attention sink) as the rest of its sequence in GPTQ's Hessian
    (:class:`lpq.weight_only.HessianAccumulator`)."""
    raw = np.asarray(value, dtype=np.float32)
    x = raw.reshape(-1, stats.k)
    if stats.hessian is not None:
        if need.first_token and raw.ndim >= 3 and raw.shape[-2] > 1:
            stats.hessian.add(raw, first_token_weight=float(raw.shape[-2]))
        else:
            stats.hessian.add(x)
    sq = np.einsum("ij,ij->j", x, x, dtype=np.float64)
    stats.sumsq = sq if stats.sumsq is None else stats.sumsq + sq
    stats.count += x.shape[0]
    if need.sample_rows:
        stats.rows.append(x[:: max(1, x.shape[0] // need.sample_rows)][: need.sample_rows].copy())
        kept = sum(r.shape[0] for r in stats.rows)
        if kept > 2 * need.sample_rows:  # thin evenly so memory stays bounded
            merged = np.concatenate(stats.rows, axis=0)
            stats.rows = [merged[:: max(1, kept // need.sample_rows)][: need.sample_rows]]


def _chunks(needs: Mapping[str, Need], tokens: int, budget_bytes: int) -> list[list[str]]:
    """Tensors grouped so one batch's activations of a group fit ``budget_bytes``."""
    groups: list[list[str]] = [[]]
    used = 0
    for name, need in needs.items():
        size = need.k * tokens * 4
        if groups[-1] and used + size > budget_bytes:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += size
    return groups


def _tokens_per_batch(model: onnx.ModelProto, calib: Iterable[Any]) -> int:
    for feed, _ in iter_batches(model, calib, None):
        ids = next(iter(feed.values()))
        return int(np.prod(ids.shape[:2])) if ids.ndim >= 2 else int(ids.size)
    raise DataError("the calibration data is empty", hint="pass at least one token window")


def collect(
    model: onnx.ModelProto,
    calib: Iterable[Any],
    needs: Mapping[str, Need],
    *,
    budget_bytes: int = 512 << 20,
) -> dict[str, TensorStats]:
    """Run ``calib`` through ``model`` (not modified) and summarise every tensor in
    ``needs``, one chunk of tensors at a time (see the module docstring)."""
    stats = {name: TensorStats.start(need) for name, need in needs.items()}
    chunks = _chunks(needs, _tokens_per_batch(model, calib), budget_bytes)
    # one detached copy for every chunk's session: the weights are held once, as arrays
    # ORT reads in place (no serialized model, no ORT copy, no pre-packed copies)
    light, blobs = weights.detach(model)
    for index, chunk in enumerate(chunks, 1):
        log.info(
            "weight-only calibration: chunk %d/%d (%d tensors)", index, len(chunks), len(chunk)
        )
        _run_chunk(light, blobs, calib, chunk, needs, stats)
    return stats


def _run_chunk(
    model: onnx.ModelProto,
    blobs: weights.Blobs,
    calib: Iterable[Any],
    chunk: list[str],
    needs: Mapping[str, Need],
    stats: dict[str, TensorStats],
) -> None:
    import onnx

    graph_inputs = {value.name for value in model.graph.input}
    extra = [name for name in chunk if name not in graph_inputs]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in extra
    )
    try:
        session = weights.session(probe, blobs, build_session_options({}), providers({}))
    except Exception as exc:
        raise ModelError(
            f"ONNX Runtime cannot load the model for weight-only calibration "
            f"({type(exc).__name__}: {exc})",
            hint="check the model with onnx.checker.check_model",
        ) from None
    del probe
    batches = 0
    for feed, _ in iter_batches(model, calib, None):
        values = dict(zip(extra, session.run(extra, feed))) if extra else {}
        for name in chunk:
            value = values[name] if name in values else feed[name]
            add(stats[name], needs[name], value)
        batches += 1
    if batches == 0:
        raise DataError("the calibration data is empty", hint="pass at least one token window")
