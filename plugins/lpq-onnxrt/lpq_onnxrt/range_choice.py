"""The ``auto`` activation range algorithm: pick minmax, percentile, mse or kl by output error.

No one range algorithm is best for every model. Minmax clips nothing, which suits
well-behaved activations, but a few extreme values stretch a range and waste its 256
levels; clipping (percentile, mse, kl) wins there. On PP-OCRv4 det the default plan's
held-out text-map IoU went from 0.908 with minmax ranges to 0.942 with mse ones, on the
recognizer from 0.833 to 0.900. So the capability's default algorithm is ``auto``: the int8
plan is built once per candidate (the histograms are already collected, so a candidate
costs one build and one run over a few calibration batches) and the candidate with the
smallest output error against fp32 is used for every op that asked for ``auto``.

Two things make that error mean what the user will see:
- it is measured on the graph that ships: after latency-aware quantization has decided the
  format and the ops that stay fp32 or go dynamic (on Silero VAD, the best ranges for the
  QDQ graph were the worst for the QOperator graph that was kept);
- for a recurrent model whose calibration data was recorded from streams, it is measured
  on whole streams, the model feeding its own state back (:mod:`lpq_onnxrt.streams`):
  per batch, from the recorded fp32 state, the error that compounds along a stream is
  invisible. On Silero VAD that picked kl (held-out 1 - MAE 0.91, minmax 0.80).

An explicit algorithm (``minmax``, ``kl``, ...) from the user or a tuning trial is never
replaced: only ops whose activation algorithm is ``auto`` are resolved, and the resolved
name is what the returned tune_cfg records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from lpq import OpConfig

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

AUTO = "auto"
#: Tried in this order; on a tie the earlier one wins (minmax: no clipping).
CANDIDATES = ("minmax", "percentile", "mse", "kl")
#: A clipping algorithm replaces minmax only when it cuts the output error by this
#: fraction: a smaller gain, measured on the calibration data itself, may not hold on
#: new data, where minmax (which never clips) is the safer bet.
MIN_GAIN = 0.02


@dataclass
class RangeChoice:
    """The algorithm ``auto`` resolved to, and each candidate's output error."""

    algorithm: str
    errors: dict[str, float]

    def to_json(self) -> dict[str, object]:
        return {"algorithm": self.algorithm, "errors": self.errors}


Key = TypeVar("Key", bound=Hashable)


def auto_ops(ops: Mapping[Key, OpConfig]) -> list[Key]:
    """The ops (keys of ``ops``) whose activation algorithm is ``auto``."""
    return [
        key
        for key, cfg in ops.items()
        if cfg.activation is not None and cfg.activation.algorithm == AUTO
    ]


def with_algorithm(cfg: OpConfig, algorithm: str) -> OpConfig:
    """``cfg`` with its activation algorithm replaced."""
    assert cfg.activation is not None
    return replace(cfg, activation=replace(cfg.activation, algorithm=algorithm))


def resolved(ops: Mapping[Key, OpConfig], algorithm: str) -> dict[Key, OpConfig]:
    """``ops`` with every ``auto`` activation algorithm set to ``algorithm``."""
    chosen = set(auto_ops(ops))
    return {
        key: with_algorithm(cfg, algorithm) if key in chosen else cfg for key, cfg in ops.items()
    }


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


def choose(
    build: Callable[[str], onnx.ModelProto],
    error: Callable[[onnx.ModelProto], float],
    candidates: tuple[str, ...] = CANDIDATES,
) -> RangeChoice:
    """Build the plan with each candidate algorithm (``build(name)``), measure its output
    error, and return the best: the first candidate unless another is ``MIN_GAIN`` better."""
    errors = {name: error(build(name)) for name in candidates}
    best = candidates[0]
    for name in candidates[1:]:
        if errors[name] < min(errors[best], errors[candidates[0]] * (1.0 - MIN_GAIN)):
            best = name
    log.info(
        "activation ranges: auto -> %s (output error %s)",
        best,
        ", ".join(f"{name} {value:.4g}" for name, value in errors.items()),
    )
    return RangeChoice(best, {name: round(value, 6) for name, value in errors.items()})


def resolve(
    plan: Mapping[str, OpConfig],
    build: Callable[[Mapping[str, OpConfig]], onnx.ModelProto],
    error: Callable[[onnx.ModelProto], float],
) -> tuple[dict[str, OpConfig], RangeChoice | None]:
    """``plan`` with its ``auto`` algorithms resolved by :func:`choose` (``build(plan)``
    builds a plan), and the choice; ``plan`` as it is when no op asks for ``auto``."""
    if not auto_ops(plan):
        return dict(plan), None
    choice = choose(lambda algorithm: build(resolved(plan, algorithm)), error)
    return resolved(plan, choice.algorithm), choice
