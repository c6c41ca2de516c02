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

A small model (at most ``NARROW_MAX_OPS`` int8 ops) then gets one more step,
:func:`narrow`: one algorithm for every tensor is still a compromise, and a tensor whose
few large values feed a float op can be worth clipping much harder than any histogram
rule says. Silero VAD's STFT conv outputs span +-18, set by the low-frequency bins; the
magnitude that follows needs the small bins, and that range's step of 0.14 rounds them
away. Each tensor's range is tried at ``NARROW_FACTORS`` of its width, and a narrowing is
kept only when it cuts the output error by ``NARROW_GAIN`` on each of two disjoint halves
of the calibration data (fitted to a few batches, a clipped range can win there and lose
on new data). On Silero VAD (bench calibration: 4 streams) the STFT input, conv output
and magnitude went to 0.35 of their ranges, and held-out 1 - MAE from 0.83 to 0.93-0.95.
The factors are recorded in the tune_cfg's options (``activation_range_scales``), so the
model can be made again from its tune_cfg.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

from lpq import ConfigError, OpConfig

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
#: :func:`narrow` runs for plans of at most this many static int8 ops (it builds the
#: model ``len(NARROW_FACTORS)`` times per tensor).
NARROW_MAX_OPS = 16
#: Fractions of a tensor's calibrated range that :func:`narrow` tries.
NARROW_FACTORS = (0.7, 0.5, 0.35)
#: A narrowing must cut the output error by this fraction: it is fitted to the
#: calibration data, and a smaller gain there may be noise on new data.
NARROW_GAIN = 0.05
#: The tune_cfg option that holds the narrowed tensors: {tensor name: factor}.
SCALES_OPTION = "activation_range_scales"


@dataclass
class RangeChoice:
    """The algorithm ``auto`` resolved to, each candidate's output error, and the tensors
    :func:`narrow` narrowed (factor of the range kept)."""

    algorithm: str
    errors: dict[str, float]
    narrowed: dict[str, float] = field(default_factory=dict)
    #: the output error with the narrowed ranges (None: narrowing did not run)
    narrowed_error: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "algorithm": self.algorithm,
            "errors": self.errors,
            "narrowed": self.narrowed,
            "narrowed_error": self.narrowed_error,
        }


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
    build: Callable[[Mapping[str, OpConfig], Mapping[str, float]], onnx.ModelProto],
    error: Callable[[onnx.ModelProto], float],
    narrowing: Narrowing | None = None,
) -> tuple[dict[str, OpConfig], RangeChoice | None]:
    """``plan`` with its ``auto`` algorithms resolved by :func:`choose`, and the choice;
    ``plan`` as it is when no op asks for ``auto``. ``build(plan, scales)`` builds a plan
    with some tensors' ranges narrowed.

    With ``narrowing`` (a small model), :func:`narrow` runs on the chosen algorithm's
    ranges and on minmax's, and the lower output error wins: the algorithm that was best
    unnarrowed need not be best narrowed (Silero VAD calibrated on 16 streams: kl first
    unnarrowed, 0.24 narrowed; minmax narrowed 0.055)."""
    if not auto_ops(plan):
        return dict(plan), None
    choice = choose(lambda algorithm: build(resolved(plan, algorithm), {}), error)
    if narrowing is not None:
        checks = narrowing.checks

        def narrowed(algorithm: str) -> tuple[dict[str, float], float]:
            ops = resolved(plan, algorithm)
            scales = narrow(narrowing.tensors, lambda s: build(ops, s), checks)
            return scales, error(build(ops, scales)) if scales else choice.errors[algorithm]

        outcomes = {a: narrowed(a) for a in dict.fromkeys((choice.algorithm, CANDIDATES[0]))}
        algorithm = min(outcomes, key=lambda a: outcomes[a][1])
        scales, final = outcomes[algorithm]
        log.info(
            "activation ranges: auto -> %s, %d tensor(s) narrowed (output error %s)",
            algorithm,
            len(scales),
            ", ".join(f"{name} narrowed {value[1]:.4g}" for name, value in outcomes.items()),
        )
        choice = replace(
            choice, algorithm=algorithm, narrowed=scales, narrowed_error=round(final, 6)
        )
    return resolved(plan, choice.algorithm), choice


@dataclass(frozen=True)
class Narrowing:
    """What :func:`narrow` needs: the tensors it may narrow, in order, and the output
    error on each of two or more disjoint parts of the calibration data."""

    tensors: Sequence[str]
    checks: Sequence[Callable[[onnx.ModelProto], float]]


def narrow(
    tensors: Sequence[str],
    build: Callable[[Mapping[str, float]], onnx.ModelProto],
    checks: Sequence[Callable[[onnx.ModelProto], float]],
    factors: tuple[float, ...] = NARROW_FACTORS,
) -> dict[str, float]:
    """Per tensor, in order, the fraction of its range (``build(scales)`` builds the plan
    with ``{tensor: fraction}``) kept on top of those kept so far, when it cuts the output
    error by ``NARROW_GAIN`` on *each* of ``checks``, disjoint parts of the calibration
    data; of those that do, the one with the smallest error in all.

    A narrowing is fitted to the data it is measured on. One that helps on only part of
    it is not kept: on Silero VAD calibrated on two streams, halving the input audio's
    range cut the output error 3.6x on both together and made held-out streams worse."""
    scales: dict[str, float] = {}
    best = [check(build(scales)) for check in checks]
    for name in tensors:
        passing = {}
        for factor in factors:
            model = build({**scales, name: factor})
            errors = [check(model) for check in checks]
            if all(e < b * (1.0 - NARROW_GAIN) for e, b in zip(errors, best, strict=True)):
                passing[factor] = errors
        if passing:
            factor = min(passing, key=lambda f: sum(passing[f]))
            log.info(
                "activation ranges: %s narrowed to %.2f of its range (output error %s -> %s)",
                name,
                factor,
                "/".join(f"{e:.4g}" for e in best),
                "/".join(f"{e:.4g}" for e in passing[factor]),
            )
            scales[name], best = factor, passing[factor]
    return scales


def scales_from(options: Mapping[str, object]) -> dict[str, float]:
    """The ``activation_range_scales`` option, checked: {tensor name: factor in (0, 1]}."""
    value = options.get(SCALES_OPTION) or {}
    if not isinstance(value, Mapping) or not all(
        isinstance(name, str) and isinstance(f, (int, float)) and 0.0 < f <= 1.0
        for name, f in value.items()
    ):
        raise ConfigError(
            f"{SCALES_OPTION} must map tensor names to fractions in (0, 1], not {value!r}",
            hint="leave it out: lpq sets it when it narrows a range",
        )
    return {name: float(f) for name, f in value.items()}
