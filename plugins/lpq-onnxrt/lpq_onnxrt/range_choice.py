"""lpq-onnxrt's backend for the ``auto`` activation range rule (:mod:`lpq.ranges`).

The rule (candidates, the smallest output error with its tie rule, the narrowing of small
plans on two disjoint parts of the calibration data, what is recorded) is core's, written
once for every adaptor; docs/onnxrt.md ("Range choice") describes it. This module is what
ONNX Runtime adds, in :class:`Backend`: how a candidate is built and what its output
error is. Two things make that error mean what the user will see:

- it is measured on the graph that ships: after latency-aware quantization has decided the
  format and the ops that stay fp32 or go dynamic (on Silero VAD, the best ranges for the
  QDQ graph were the worst for the QOperator graph that was kept);
- for a recurrent model whose calibration data was recorded from streams, it is measured
  on whole streams, the model feeding its own state back (:mod:`lpq_onnxrt.streams`):
  per batch, from the recorded fp32 state, the error that compounds along a stream is
  invisible. On Silero VAD that picked kl (held-out 1 - MAE 0.91, minmax 0.80).

The names other modules of the adaptor use (``AUTO``, ``resolved``, ``scales_from``, ...)
are core's, re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, TypeVar

from lpq import OpConfig
from lpq.ranges import (
    AUTO,
    CANDIDATES,
    NARROW_MAX_OPS,
    NARROW_MAX_VALUES,
    PARTS,
    SCALES_OPTION,
    RangeChoice,
    auto_ops,
    narrowing_pays,
    resolved,
    scales_from,
    with_algorithm,
)

if TYPE_CHECKING:
    import onnx

__all__ = [
    "AUTO",
    "CANDIDATES",
    "NARROW_MAX_OPS",
    "NARROW_MAX_VALUES",
    "SCALES_OPTION",
    "Backend",
    "RangeChoice",
    "auto_ops",
    "for_decisions",
    "narrowing_pays",
    "resolved",
    "scales_from",
    "with_algorithm",
]

Key = TypeVar("Key", bound=Hashable)
Error = Callable[["onnx.ModelProto"], float]


def for_decisions(ops: Mapping[Key, OpConfig]) -> dict[Key, OpConfig]:
    """``ops`` as latency-aware quantization measures them: every activation range minmax.

    Which ops run faster in int8 does not depend on the range algorithm; measured once
    per graph, one cached decision serves every algorithm a tuning run tries (PP-OCRv4
    det: a kl, percentile or mse trial took 45-60 s deciding again, a cached one 2 s).
    The requested algorithm is then applied to the graph the decisions leave."""
    return {
        key: with_algorithm(cfg, "minmax") if cfg.activation is not None else cfg
        for key, cfg in ops.items()
    }


class Backend:
    """:class:`lpq.ranges.RangeBackend` for ONNX models: ``build(plan, scales)`` builds the
    graph that ships; ``error`` is the output error on the calibration feeds (or streams),
    and ``part_error((k, n))`` makes the error function on the k-th of n disjoint parts of
    them, made once per part (each one runs the fp32 model once for its reference)."""

    def __init__(
        self,
        build: Callable[[Mapping[str, OpConfig], Mapping[str, float]], onnx.ModelProto],
        error: Error,
        part_error: Callable[[tuple[int, int]], Error],
    ) -> None:
        self._build = build
        self._error = error
        self._part_error = part_error
        self._parts: dict[int, Error] = {}

    def build(self, plan: Mapping[str, OpConfig], scales: Mapping[str, float]) -> onnx.ModelProto:
        return self._build(plan, scales)

    def error(self, model: onnx.ModelProto, part: int | None = None) -> float:
        if part is None:
            return self._error(model)
        if part not in self._parts:
            self._parts[part] = self._part_error((part, PARTS))
        return self._parts[part](model)
