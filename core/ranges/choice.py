"""The ``auto`` activation range rule: pick minmax, percentile, mse or kl by output error,
then narrow single tensors' ranges on small models.

No one range algorithm is best for every model. Minmax clips nothing, which suits
well-behaved activations, but a few extreme values stretch a range and waste its 256
levels; clipping (percentile, mse, kl) wins there. On PP-OCRv4 det the default plan's
held-out text-map IoU went from 0.908 with minmax ranges to 0.942 with mse ones, on the
recognizer from 0.833 to 0.900. So an adaptor's default algorithm is ``auto``: the plan is
built once per candidate (:data:`CANDIDATES`; the calibration statistics are already
collected, so a candidate costs one build and one run over some calibration batches), and
the candidate with the smallest output error against fp32 is used for every op that asked
for ``auto`` (:func:`pick` says how ties and small gains are settled).

An explicit algorithm (``minmax``, ``kl``, ...) from the user or a tuning trial is never
replaced: only ops whose activation algorithm is ``auto`` are resolved, and the resolved
name is what the returned tune_cfg records.

A small plan (at most :data:`NARROW_MAX_OPS` ops, on at most :data:`NARROW_MAX_VALUES`
calibration activations, see :func:`narrowing_pays`) then gets one more step,
:func:`narrow`:
one algorithm for every tensor is still a compromise, and a tensor whose few large values
feed a float op can be worth clipping much harder than any histogram rule says. Silero
VAD's STFT conv outputs span +-18, set by the low-frequency bins; the magnitude that
follows needs the small bins, and that range's step of 0.14 rounds them away. Each
tensor's range is tried at :data:`NARROW_FACTORS` of its width, and a narrowing is kept
only when it cuts the output error by :data:`NARROW_GAIN` on *each* of :data:`PARTS`
disjoint parts of the calibration data (fitted to a few batches, a clipped range can win
there and lose on new data). On Silero VAD (4 calibration streams) the STFT input, conv
output and magnitude went to 0.35 of their ranges, and held-out 1 - MAE from 0.83 to
0.93-0.95. The factors are recorded in the tune_cfg's options (:data:`SCALES_OPTION`), so
the model can be made again from its tune_cfg.

The rule is written once here; an adaptor supplies a :class:`RangeBackend` (build the
plan with given algorithms and narrowed tensors; measure a model's output error on the
calibration data or on one part of it). What the error means is the adaptor's to say
(lpq-onnxrt measures it on the graph that ships and, for a recurrent model, on whole
streams).

Cost: a fraction that misses the gain on one part is not measured on the others (it
could not be kept), and a model the rule already built (an algorithm unnarrowed, the last
narrowing kept) is not built again. On MTCNN P-Net (5 ops, 8-picture halves): 71 output
error runs instead of 117 and 58 builds instead of 63, for the same choice.
:func:`record` writes the choice into the tune_cfg.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from ..errors import ConfigError
from ..plan.tune_config import OpConfig, TuneConfig

log = logging.getLogger(__name__)

AUTO = "auto"
#: Tried in this order; on a tie the earlier one wins (minmax: no clipping).
CANDIDATES = ("minmax", "percentile", "mse", "kl")
#: A clipping algorithm replaces minmax only when it cuts the output error by this
#: fraction: a smaller gain, measured on the calibration data itself, may not hold on
#: new data, where minmax (which never clips) is the safer bet.
MIN_GAIN = 0.02
#: :func:`narrow` runs for plans of at most this many ops (it builds the model
#: ``len(NARROW_FACTORS)`` times per tensor).
NARROW_MAX_OPS = 16
#: ... and when one pass over the calibration data computes at most this many activation
#: values (the adaptor counts them in its calibration statistics): narrowing measures
#: tens of models on that data, so its cost is tens of such passes. Silero VAD (4
#: streams): 0.86 million, narrowed in about a second; MTCNN P-Net on 51 pictures of
#: 320x240: 211 million, where narrowing cost 25 of the 40 CPU seconds of a
#: quantization (ORT's own quantize_static: 3).
NARROW_MAX_VALUES = 16_000_000
#: Fractions of a tensor's calibrated range that :func:`narrow` tries, widest first.
NARROW_FACTORS = (0.7, 0.5, 0.35)
#: A narrowing must cut the output error by this fraction on every part: it is fitted to
#: the calibration data, and a smaller gain there may be noise on new data.
NARROW_GAIN = 0.05
#: Disjoint parts of the calibration data a narrowing must help on.
PARTS = 2
#: The tune_cfg option that holds the narrowed tensors: {tensor name: factor}.
SCALES_OPTION = "activation_range_scales"

Key = TypeVar("Key", bound=Hashable)
M = TypeVar("M")


class RangeBackend(Protocol[M]):
    """What :func:`resolve` asks an adaptor: build a plan, measure a model's error."""

    def build(self, plan: Mapping[str, OpConfig], scales: Mapping[str, float]) -> M:
        """The model quantized as ``plan`` says (every activation algorithm explicit),
        with the ranges of the tensors in ``scales`` narrowed to that fraction."""
        ...

    def error(self, model: M, part: int | None = None) -> float:
        """``model``'s output error against fp32 on the calibration data (lower is
        better); with ``part=k``, on the k-th of :data:`PARTS` disjoint parts of it."""
        ...


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


def auto_ops(ops: Mapping[Key, OpConfig]) -> list[Key]:
    """The ops (keys of ``ops``) whose activation algorithm is ``auto``."""
    return [
        key
        for key, cfg in ops.items()
        if cfg.activation is not None and cfg.activation.algorithm == AUTO
    ]


def with_algorithm(cfg: OpConfig, algorithm: str) -> OpConfig:
    """``cfg`` with its activation algorithm replaced."""
    if cfg.activation is None:
        raise ConfigError(
            "an op without activation settings has no range algorithm to set",
            hint="set the algorithm only on ops that quantize their activations",
        )
    return replace(cfg, activation=replace(cfg.activation, algorithm=algorithm))


def resolved(ops: Mapping[Key, OpConfig], algorithm: str) -> dict[Key, OpConfig]:
    """``ops`` with every ``auto`` activation algorithm set to ``algorithm``."""
    chosen = set(auto_ops(ops))
    return {
        key: with_algorithm(cfg, algorithm) if key in chosen else cfg for key, cfg in ops.items()
    }


def narrowing_pays(ops: int, values: int) -> bool:
    """Whether :func:`narrow` runs for a plan of ``ops`` ops whose calibration computed
    ``values`` activation values in all (:data:`NARROW_MAX_OPS`,
    :data:`NARROW_MAX_VALUES`): a small plan on data cheap enough to measure tens of
    models on. The count is a measure of work that does not depend on the machine or its
    load, so the same model and data always get the same choice."""
    return ops <= NARROW_MAX_OPS and values <= NARROW_MAX_VALUES


def pick(errors: Mapping[str, float], candidates: Sequence[str] = CANDIDATES) -> str:
    """The candidate with the smallest error, where a candidate other than the first
    (minmax: no clipping) must also beat the first by :data:`MIN_GAIN`; on a tie the
    earlier candidate wins."""
    best = candidates[0]
    for name in candidates[1:]:
        if errors[name] < min(errors[best], errors[candidates[0]] * (1.0 - MIN_GAIN)):
            best = name
    return best


def narrow(
    tensors: Sequence[str],
    build: Callable[[Mapping[str, float]], M],
    error: Callable[[M, int], float],
    factors: Sequence[float] = NARROW_FACTORS,
    parts: int = PARTS,
    start: tuple[M, Sequence[float]] | None = None,
) -> tuple[dict[str, float], M | None]:
    """Per tensor, in order, the fraction of its range (``build(scales)`` builds the plan
    with ``{tensor: fraction}``) kept on top of those kept so far, when it cuts the output
    error (``error(model, part)``) by :data:`NARROW_GAIN` on *each* of ``parts`` disjoint
    parts of the calibration data; of those that do, the one with the smallest error in
    all. Returns the fractions and the model built with them (None when none was kept).
    ``start``: the un-narrowed model and its errors per part, when the caller has them.

    A narrowing is fitted to the data it is measured on. One that helps on only part of
    it is not kept: on Silero VAD calibrated on two streams, halving the input audio's
    range cut the output error 3.6x on both together and made held-out streams worse.
    A fraction that misses the gain on one part is not measured on the next ones."""
    scales: dict[str, float] = {}
    if start is None:
        plain = build(scales)
        best = [error(plain, part) for part in range(parts)]
    else:
        best = list(start[1])
    kept: M | None = None
    for name in tensors:
        passing: dict[float, tuple[list[float], M]] = {}
        for factor in factors:
            model = build({**scales, name: factor})
            errors: list[float] = []
            for part in range(parts):
                value = error(model, part)
                if not value < best[part] * (1.0 - NARROW_GAIN):
                    break
                errors.append(value)
            else:
                passing[factor] = (errors, model)
            del model
        if passing:
            factor = min(passing, key=lambda f: sum(passing[f][0]))
            log.info(
                "activation ranges: %s narrowed to %.2f of its range (output error %s -> %s)",
                name,
                factor,
                "/".join(f"{e:.4g}" for e in best),
                "/".join(f"{e:.4g}" for e in passing[factor][0]),
            )
            scales[name] = factor
            best, kept = passing[factor]
    return scales, kept


def resolve(
    plan: Mapping[str, OpConfig],
    backend: RangeBackend[M],
    narrowable: Sequence[str] | None = None,
    candidates: Sequence[str] = CANDIDATES,
) -> tuple[dict[str, OpConfig], RangeChoice | None]:
    """``plan`` with its ``auto`` algorithms resolved (each candidate built and measured,
    the best :func:`pick`-ed), and the choice; ``plan`` as it is when no op asks for
    ``auto``.

    With ``narrowable`` (the tensors :func:`narrow` may narrow, in order; for a small
    plan), narrowing runs on the chosen algorithm's ranges and on the first candidate's
    (minmax), and the lower output error wins: the algorithm that was best unnarrowed
    need not be best narrowed (Silero VAD calibrated on 16 streams: kl first unnarrowed,
    0.24 narrowed; minmax narrowed 0.055)."""
    if not auto_ops(plan):
        return dict(plan), None
    errors: dict[str, float] = {}
    plain: dict[str, M] = {}  # the unnarrowed models narrowing will start from
    for name in candidates:
        model = backend.build(resolved(plan, name), {})
        errors[name] = backend.error(model)
        if narrowable is not None:  # kept: the first candidate and the best so far
            plain[name] = model
            leader = pick(errors, candidates[: len(errors)])
            plain = {k: v for k, v in plain.items() if k in (candidates[0], leader)}
        del model
    algorithm = pick(errors, candidates)
    log.info(
        "activation ranges: auto -> %s (output error %s)",
        algorithm,
        ", ".join(f"{name} {value:.4g}" for name, value in errors.items()),
    )
    choice = RangeChoice(algorithm, {name: round(value, 6) for name, value in errors.items()})
    if narrowable is not None:
        outcomes: dict[str, tuple[dict[str, float], float]] = {}
        for name in dict.fromkeys((algorithm, candidates[0])):
            ops = resolved(plan, name)
            start = plain.pop(name)
            parted = (start, [backend.error(start, part) for part in range(PARTS)])
            del start
            outcome = narrow(narrowable, _builder(backend, ops), backend.error, start=parted)
            narrowed, kept = outcome
            del parted
            final = backend.error(kept) if kept is not None else errors[name]
            outcomes[name] = (narrowed, final)
            del kept, outcome
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


def record(
    tune_cfg: TuneConfig, plan: Mapping[str, OpConfig], choice: RangeChoice | None
) -> TuneConfig:
    """``tune_cfg`` as applied: each op that asked for ``auto`` (and is in ``plan``, keyed
    by op name) with the algorithm it resolved to, and the tensors :func:`narrow` narrowed
    added to :data:`SCALES_OPTION` (over those it already records). Quantizing the result
    again gives the same model, with nothing left to choose."""
    changed = {
        key: plan[key[0]]
        for key, cfg in tune_cfg.ops.items()
        if key[0] in plan and cfg.activation is not None and cfg.activation.algorithm == AUTO
    }
    recorded = tune_cfg.with_ops(changed)
    if choice is not None and choice.narrowed:
        scales = {**scales_from(tune_cfg.options), **choice.narrowed}
        recorded = recorded.with_options({SCALES_OPTION: scales})
    return recorded


def _builder(
    backend: RangeBackend[M], ops: Mapping[str, OpConfig]
) -> Callable[[Mapping[str, float]], M]:
    return lambda scales: backend.build(ops, scales)


def scales_from(options: Mapping[str, object]) -> dict[str, float]:
    """The :data:`SCALES_OPTION` option, checked: {tensor name: factor in (0, 1]}."""
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
