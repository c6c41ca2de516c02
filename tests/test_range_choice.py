"""lpq.ranges: the ``auto`` range rule in core, driven by a scripted fake backend.

The fake "model" is the pair (algorithm, narrowed tensors) it was built with; its output
error on each part of the calibration data comes from a script, and the backend counts
what the rule asked of it (builds, error runs per part), so the tests see both the
decisions and their cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

import lpq
from lpq.ranges import (
    AUTO,
    CANDIDATES,
    NARROW_FACTORS,
    PARTS,
    SCALES_OPTION,
    RangeChoice,
    narrow,
    pick,
    record,
    resolve,
    resolved,
    scales_from,
)

Model = tuple[str, tuple[tuple[str, float], ...]]
Script = Callable[[str, dict[str, float]], tuple[float, ...]]


class FakeBackend:
    """``script(algorithm, scales)`` gives a model's error on each of the PARTS parts; its
    error on all the data is their mean."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.builds: list[Model] = []
        self.runs: list[tuple[Model, int | None]] = []

    def build(self, plan: Mapping[str, lpq.OpConfig], scales: Mapping[str, float]) -> Model:
        algorithms = {c.activation.algorithm for c in plan.values() if c.activation}
        assert AUTO not in algorithms  # the rule resolves before building
        auto = plan["op"].activation
        assert auto is not None
        model = (auto.algorithm, tuple(sorted(scales.items())))
        self.builds.append(model)
        return model

    def error(self, model: Model, part: int | None = None) -> float:
        self.runs.append((model, part))
        errors = self.script(model[0], dict(model[1]))
        return sum(errors) / len(errors) if part is None else errors[part]


def _op(algorithm: str = AUTO) -> lpq.OpConfig:
    return lpq.OpConfig(
        precision="int8",
        mode="static",
        activation=lpq.TensorConfig("uint8", "asym", algorithm=algorithm),
    )


def _errors(unnarrowed: dict[str, float]) -> Script:
    return lambda algorithm, scales: (unnarrowed[algorithm],) * PARTS


# --------------------------------------------------------------------------- pick


def test_pick_keeps_minmax_unless_a_clipping_algorithm_is_clearly_better():
    assert pick({"minmax": 1.0, "percentile": 0.5, "mse": 0.7}, CANDIDATES[:3]) == "percentile"
    assert pick({"minmax": 1.0, "percentile": 0.9, "mse": 0.6}, CANDIDATES[:3]) == "mse"
    # 1% better on the calibration data itself: noise, minmax stays.
    assert pick({"minmax": 1.0, "percentile": 0.99, "mse": 1.2}, CANDIDATES[:3]) == "minmax"
    assert pick({"minmax": 0.3, "percentile": 0.5, "mse": 0.4}, CANDIDATES[:3]) == "minmax"


def test_pick_settles_a_tie_for_the_earlier_candidate():
    errors = {"minmax": 1.0, "percentile": 0.5, "mse": 0.5, "kl": 0.5}
    assert pick(errors) == "percentile"


# --------------------------------------------------------------------------- resolve


def test_resolve_builds_and_measures_each_candidate_once_and_records_the_errors():
    backend = FakeBackend(_errors({"minmax": 1.0, "percentile": 0.9, "mse": 0.6, "kl": 0.7}))
    plan, choice = resolve({"op": _op(), "fixed": _op("kl")}, backend)
    assert choice is not None and choice.algorithm == "mse"
    assert choice.errors == {"minmax": 1.0, "percentile": 0.9, "mse": 0.6, "kl": 0.7}
    assert choice.narrowed == {} and choice.narrowed_error is None
    assert plan["op"].activation.algorithm == "mse"
    assert plan["fixed"].activation.algorithm == "kl"  # explicit: never replaced
    assert [model[0] for model in backend.builds] == list(CANDIDATES)
    assert all(part is None for _, part in backend.runs) and len(backend.runs) == 4


def test_resolve_leaves_a_plan_without_auto_as_it_is():
    backend = FakeBackend(_errors(dict.fromkeys(CANDIDATES, 1.0)))
    plan = {"op": _op("percentile")}
    assert resolve(plan, backend) == (plan, None)
    assert backend.builds == []


def test_resolve_takes_the_algorithm_that_narrows_best():
    """kl is best unnarrowed; minmax narrowed beats kl narrowed, so minmax is chosen."""
    unnarrowed = {"minmax": 1.0, "percentile": 0.9, "mse": 0.9, "kl": 0.5}

    def script(algorithm: str, scales: dict[str, float]) -> tuple[float, ...]:
        if "t" in scales:
            return ({"minmax": 0.1, "kl": 0.4}.get(algorithm, 1.0),) * PARTS
        return (unnarrowed[algorithm],) * PARTS

    _, choice = resolve({"op": _op()}, FakeBackend(script))
    assert choice is not None and choice.algorithm == "kl" and not choice.narrowed
    plan, choice = resolve({"op": _op()}, FakeBackend(script), ["t"])
    assert choice is not None and choice.algorithm == "minmax"
    assert choice.narrowed == {"t": max(NARROW_FACTORS)}
    assert choice.narrowed_error == pytest.approx(0.1)
    assert plan["op"].activation.algorithm == "minmax"


def test_resolve_does_not_build_a_model_twice():
    """The unnarrowed models narrowing starts from are the ones the candidates were
    measured on, and the final narrowed model is the last one narrowing kept."""

    def script(algorithm: str, scales: dict[str, float]) -> tuple[float, ...]:
        base = {"minmax": 1.0, "percentile": 0.9, "mse": 0.8, "kl": 0.5}[algorithm]
        return (base * (0.5 if scales.get("t") == 0.5 else 1.0),) * PARTS

    backend = FakeBackend(script)
    _, choice = resolve({"op": _op()}, backend, ["t", "u"])
    assert choice is not None and choice.algorithm == "kl" and choice.narrowed == {"t": 0.5}
    assert len(backend.builds) == len(set(backend.builds))
    # 4 candidates, then per narrowed algorithm (kl, minmax) 3 fractions of 2 tensors
    assert len(backend.builds) == 4 + 2 * 2 * len(NARROW_FACTORS)


# --------------------------------------------------------------------------- narrow


def _narrow(errors: Callable[[dict[str, float]], tuple[float, ...]], tensors: list[str]) -> Any:
    """narrow with scripted errors; returns the fractions and the error runs per part."""
    runs: list[int] = []

    def error(model: dict[str, float], part: int) -> float:
        runs.append(part)
        return float(errors(model)[part])

    scales, _ = narrow(tensors, dict, error)
    return scales, runs


def test_narrow_keeps_a_fraction_only_when_it_clearly_cuts_the_error_on_every_part():
    def errors(scales: dict[str, float]) -> tuple[float, float]:
        error = 1.0
        error *= {0.7: 0.8, 0.5: 0.4, 0.35: 0.6}.get(scales.get("a", 1.0), 1.0)
        error *= 0.98 if "b" in scales else 1.0  # a 2% gain: noise, not kept
        if "c" in scales:  # helps only once "a" is narrowed
            error *= 0.5 if "a" in scales else 1.5
        return error, error

    # "a": its best fraction; "b": left; "c": every fraction ties, the widest is kept.
    assert _narrow(errors, ["a", "b", "c"])[0] == {"a": 0.5, "c": 0.7}
    assert _narrow(errors, ["b", "c"])[0] == {}


def test_narrow_leaves_a_fraction_that_helps_on_one_part_only():
    def errors(scales: dict[str, float]) -> tuple[float, float]:
        if "fitted" in scales:  # much better on part 0, a little worse on part 1
            return 0.2, 1.01
        return 1.0, 1.0

    assert _narrow(errors, ["fitted"])[0] == {}


def test_a_fraction_that_misses_on_the_first_part_is_not_measured_on_the_next():
    def errors(scales: dict[str, float]) -> tuple[float, float]:
        return (0.99, 0.1) if scales else (1.0, 1.0)  # misses the gain on part 0

    scales, runs = _narrow(errors, ["a"])
    assert scales == {}
    # the start on both parts, then each fraction on part 0 only
    assert runs == [0, 1] + [0] * len(NARROW_FACTORS)


def test_narrow_returns_the_model_built_with_the_fractions_it_kept():
    def error(model: dict[str, float], part: int) -> float:
        return 0.5 if model.get("a") == 0.35 else 1.0

    scales, model = narrow(["a"], dict, error)
    assert scales == {"a": 0.35} and model == {"a": 0.35}
    assert narrow(["a"], dict, lambda m, p: 1.0) == ({}, None)


# --------------------------------------------------------------------------- recording


def test_resolved_sets_only_auto_algorithms():
    plan = {"a": _op(), "b": _op("kl")}
    out = resolved(plan, "mse")
    assert out["a"].activation.algorithm == "mse" and out["b"].activation.algorithm == "kl"


@pytest.mark.parametrize("value", [{"y": 0.0}, {"y": 1.5}, ["y"], {"y": "half"}, {3: 0.5}])
def test_a_bad_scales_option_is_a_config_error(value):
    with pytest.raises(lpq.ConfigError, match=SCALES_OPTION):
        scales_from({SCALES_OPTION: value})


def test_the_scales_option_reads_back():
    assert scales_from({SCALES_OPTION: {"y": 0.5, "z": 1}}) == {"y": 0.5, "z": 1.0}
    assert scales_from({}) == {}


def test_record_spells_out_what_auto_chose_and_keeps_recorded_scales():
    ops = {("a", "Conv"): _op(), ("b", "Conv"): _op("kl"), ("c", "Relu"): _op()}
    cfg = lpq.TuneConfig(ops=ops, options={SCALES_OPTION: {"x": 0.5}, "other": 1})
    plan = resolved({"a": _op(), "b": _op("kl")}, "mse")  # "c" was decided elsewhere
    choice = RangeChoice("mse", {"mse": 0.1}, narrowed={"y": 0.35})
    out = record(cfg, plan, choice)
    algorithms = {key[0]: c.activation.algorithm for key, c in out.ops.items()}
    assert algorithms == {"a": "mse", "b": "kl", "c": AUTO}
    assert out.options == {SCALES_OPTION: {"x": 0.5, "y": 0.35}, "other": 1}
    assert cfg.options[SCALES_OPTION] == {"x": 0.5}  # the input is left as it was
    unnarrowed = record(cfg, plan, RangeChoice("mse", {"mse": 0.1}))
    assert unnarrowed.options == cfg.options
