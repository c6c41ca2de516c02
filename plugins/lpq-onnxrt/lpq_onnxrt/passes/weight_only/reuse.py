"""What the trials of one tuning run share: calibration statistics and quantized weights.

Every trial of ``lpq.fit`` quantizes the whole model, and most of it exactly as the trial
before did. Two things are the same in every trial and are kept as files under the
run's cache folder (:func:`lpq.run_cache`'s ``folder``, ``<workspace>/<run>/cache/``):

* **Calibration statistics** (:class:`Calibration`): the staged run feeds the *fp32*
  model's activations to the statistics (:mod:`.stages`), so what a trial collects
  depends on the model, the calibration batches and what is summarised (the
  :class:`~.activations.Need` per tensor), not on the trial's choices. The first trial
  writes each stage's statistics and the embedding streams' comparison; a later trial
  with the same key reads them back one stage at a time and runs no ONNX Runtime
  session at all. GPTQ Hessians (one (K, K) float64 matrix per MatMul input) are not
  written: a run that needs them calibrates in every trial.
* **lm_head's int8 measurement** (:func:`remembered`), keyed by the head's weight,
  its input rows and the thresholds.
* **Quantized weights** (:func:`quantized`): a MatMul quantized int4 by the scale
  search, block 32, from the same weight and statistics, is the same array in every
  trial. The key is everything it is computed from: the weight's bytes, the choice
  (algorithm, bits, block, scheme), the statistics the algorithm reads (the scale
  search's channel mean squares, GPTQ's Hessian) and the options that change it. RTN
  costs less than its key and AWQ (a search over a group, folded into the graph) is
  not kept.

Files only, never the run cache's memory (it holds 16 values, one of them the prepared
model, which hundreds of weights would push out); reading a file back costs
milliseconds. Outside ``fit`` (``lpq.quantize``: a cache without a folder) nothing is
kept. A corrupt or missing file is computed again.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

import lpq
from lpq.fileio import atomic_write
from lpq.weight_only import BlockQuantized

from ... import weights
from .activations import Need, TensorStats
from .plan import LayerChoice

if TYPE_CHECKING:
    import onnx

T = TypeVar("T")

NAMESPACE = "onnxrt-weight-only"
#: Options that change what an algorithm computes (the rest only steer the pass).
ALGORITHM_OPTIONS = {"gptq": ("gptq_damp", "gptq_act_order"), "scale_search": ()}
#: Bumped when a quantizer's output changes for the same inputs (old files are ignored).
VERSION = 2  # 2: symmetric int4 on the signed-extreme grid


def key(
    weight: np.ndarray,
    choice: LayerChoice,
    stats: TensorStats | None,
    options: Mapping[str, Any],
) -> str | None:
    """The run-cache key of ``weight`` quantized as ``choice`` from ``stats``, or None
    when it is not kept (RTN, AWQ: see the module docstring)."""
    if choice.algorithm not in ALGORITHM_OPTIONS:
        return None
    read: Any = None
    if stats is not None:
        if choice.algorithm == "gptq" and stats.hessian is not None:
            read = np.asarray(stats.hessian.hessian)
        elif choice.algorithm == "scale_search":
            read = stats.importance()
    return lpq.content_key(
        VERSION,
        np.ascontiguousarray(weight),
        [choice.algorithm, choice.bits, choice.block_size, choice.symmetric],
        read if read is not None else "none",
        {name: str(options.get(name)) for name in ALGORITHM_OPTIONS[choice.algorithm]},
    )


def quantized(
    weight: np.ndarray,
    choice: LayerChoice,
    stats: TensorStats | None,
    options: Mapping[str, Any],
    compute: Callable[[], BlockQuantized],
) -> BlockQuantized:
    """``compute()``, or what it returned for the same inputs earlier in this run."""
    found = key(weight, choice, stats, options) if folder() is not None else None
    if found is None:
        return compute()
    return lpq.run_cache().get_or_compute(
        f"{NAMESPACE}/weights", found, compute, save=_save, load=_load, memory=False
    )


def remembered(kind: str, parts: Sequence[Any], compute: Callable[[], T]) -> T:
    """``compute()`` (a JSON value), or what it returned for the same ``parts`` earlier
    in this run (lm_head's int8 measurement: 1.7 s on SmolLM2's 576 x 49152 head)."""
    return lpq.run_cache().get_or_compute(
        f"{NAMESPACE}/{kind}",
        lpq.content_key(VERSION, *parts),
        compute,
        save=lambda value, handle: handle.write(json.dumps(value).encode()),
        load=lambda handle: cast(T, json.loads(handle.read())),
        memory=False,
    )


def folder() -> Path | None:
    """This run's folder for the weight-only pass, or None outside a tuning run."""
    root = lpq.run_cache().folder
    return root / NAMESPACE if root is not None else None


def model_digest(model: onnx.ModelProto) -> str:
    """A hash of the graph and every initializer's bytes (SmolLM2-135M: ~0.3 s)."""
    digest = hashlib.sha256()
    digest.update(weights.shell(model).SerializeToString(deterministic=True))
    for init in model.graph.initializer:
        digest.update(init.name.encode() + b"\0")
        digest.update(np.ascontiguousarray(weights.array(init)).data)
    return digest.hexdigest()[:32]


class Calibration:
    """The calibration statistics of one model on one set of batches, as files: one per
    summarised tensor, the streams' comparison, and a marker once all were written."""

    def __init__(self, root: Path, *parts: Any) -> None:
        self.dir = root / "calibration" / lpq.content_key(VERSION, *parts)

    @classmethod
    def of(
        cls,
        model: onnx.ModelProto,
        feeds: Sequence[Mapping[str, np.ndarray]],
        needs: Mapping[str, Need],
        streams: Sequence[str],
        extra: Any,
    ) -> Calibration | None:
        """The files for this calibration in this run, or None when nothing is kept
        (no run folder, or a GPTQ Hessian among the needs)."""
        root = folder()
        if root is None or any(need.hessian for need in needs.values()):
            return None
        return cls(
            root,
            model_digest(model),
            [dict(feed) for feed in feeds],
            {name: [n.k, n.hessian, n.sample_rows] for name, n in needs.items()},
            list(streams),
            extra,
        )

    @property
    def complete(self) -> bool:
        return (self.dir / "done").exists()

    def _file(self, tensor: str) -> Path:
        return self.dir / lpq.content_key(tensor)

    def save(self, tensor: str, stats: TensorStats) -> None:
        rows = np.concatenate(stats.rows, axis=0) if stats.rows else np.zeros((0, stats.k))
        buffer = io.BytesIO()
        np.savez(
            buffer,
            sumsq=stats.sumsq if stats.sumsq is not None else np.zeros(0),
            has_sumsq=np.array(stats.sumsq is not None),
            rows=rows.astype(np.float32),
            meta=np.array([stats.k, stats.count, stats.limit], np.int64),
        )
        with atomic_write(self._file(tensor), "wb") as handle:
            handle.write(buffer.getvalue())

    def load(self, tensor: str) -> TensorStats:
        with open(self._file(tensor), "rb") as handle, np.load(handle) as data:
            k, count, limit = (int(v) for v in data["meta"])
            rows = np.array(data["rows"])
            return TensorStats(
                k,
                None,
                np.array(data["sumsq"]) if bool(data["has_sumsq"]) else None,
                count,
                [rows] if len(rows) else [],
                limit,
            )

    def save_compared(self, compared: Mapping[str, Mapping[str, float]]) -> None:
        with atomic_write(self.dir / "compared.json", "w") as handle:
            json.dump(compared, handle)

    def load_compared(self) -> dict[str, dict[str, float]]:
        return dict(json.loads((self.dir / "compared.json").read_text()))

    def finish(self) -> None:
        with atomic_write(self.dir / "done", "w") as handle:
            handle.write("ok")


def _save(value: BlockQuantized, handle: Any) -> None:
    buffer = io.BytesIO()
    np.savez(
        buffer,
        codes=value.codes,
        scales=value.scales,
        zero_points=value.zero_points,
        meta=np.array([value.bits, value.block_size, int(value.symmetric)], np.int64),
    )
    handle.write(buffer.getvalue())


def _load(handle: Any) -> BlockQuantized:
    with np.load(handle) as data:
        bits, block, symmetric = (int(v) for v in data["meta"])
        return BlockQuantized(
            np.array(data["codes"]),
            np.array(data["scales"]),
            np.array(data["zero_points"]),
            bits,
            block,
            bool(symmetric),
        )
