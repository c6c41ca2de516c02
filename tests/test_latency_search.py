"""lpq.latency: the search in core, driven by a scripted fake backend (no real timing).

The fake model is a chain of ops; a candidate's time is the sum of each op's fp32 or int8
cost plus a quantize/dequantize cost wherever a float op meets an int8 one. The fake timer
adds per-round load (shared by every candidate of a round, as on a busy machine) and
per-run jitter, from a seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

import lpq
from lpq.latency import Decision, Timing, decide, enabled, interleaved
from lpq.latency import cache as latency_cache
from lpq.latency.judging import Judge
from lpq.latency.search import announce


class FakeBackend:
    def __init__(
        self,
        ops: Sequence[tuple[str, str]],
        fp32: Mapping[str, float],
        int8: Mapping[str, float],
        boundary: float = 0.0,
    ) -> None:
        self._ops = list(ops)
        self.fp32, self.int8, self.boundary = dict(fp32), dict(int8), boundary
        self.built: list[frozenset[str]] = []

    def ops(self) -> list[tuple[str, str]]:
        return self._ops

    def build(self, keep_float: frozenset[str]) -> frozenset[str]:
        self.built.append(keep_float)
        return keep_float

    def runner(self, candidate: frozenset[str]) -> Any:
        raise AssertionError("the fake timer never runs candidates")

    def cost(self, keep: frozenset[str]) -> float:
        total, previous = 0.1, True  # model input is float
        for name, _ in self._ops:
            is_float = name in keep
            total += self.fp32[name] if is_float else self.int8[name]
            total += self.boundary if is_float != previous else 0.0
            previous = is_float
        return total + (self.boundary if not previous else 0.0)


def fake_timer(backend: FakeBackend, jitter: float = 0.01, load: float = 0.5, seed: int = 0):
    rng = random.Random(seed)

    def timer(candidates: Mapping[str, frozenset[str]]) -> Timing:
        samples: dict[str, list[float]] = {label: [] for label in candidates}
        for _ in range(20):
            busy = 1.0 + load * rng.random()  # the whole round slows down alike
            for label, keep in candidates.items():
                ms = backend.cost(keep) * busy * math.exp(rng.gauss(0.0, jitter))
                samples[label].append(ms / 1e3)
        return Timing(samples)

    return timer


def convs_and_adds(add_int8: float) -> FakeBackend:
    ops = [("c1", "Conv"), ("a1", "Add"), ("c2", "Conv"), ("a2", "Add"), ("c3", "Conv")]
    fp32 = {"c1": 1.0, "c2": 1.0, "c3": 1.0, "a1": 0.3, "a2": 0.3}
    int8 = {"c1": 0.6, "c2": 0.6, "c3": 0.6, "a1": add_int8, "a2": add_int8}
    return FakeBackend(ops, fp32, int8)


def test_an_op_type_slower_in_int8_is_kept_float() -> None:
    backend = convs_and_adds(add_int8=0.6)  # int8 Add twice as slow as fp32
    decision = decide(backend, timer=fake_timer(backend))
    assert decision.keep_float == ["a1", "a2"]
    assert decision.quantized == ["c1", "c2", "c3"]
    assert not decision.slower_than_float
    assert decision.speedup is not None and decision.speedup > 1.0
    assert decision.speedup > decision.planned_speedup  # type: ignore[operator]
    assert [s.change for s in decision.steps if s.kept] == ["Add (2 ops) -> float"]


def test_a_clear_win_is_kept_without_searching() -> None:
    backend = convs_and_adds(add_int8=0.1)
    decision = decide(backend, timer=fake_timer(backend))
    assert decision.keep_float == [] and len(decision.steps) == 1
    assert set(backend.built) == {frozenset(), frozenset(backend.fp32)}


def test_noise_within_the_margin_never_flips_a_decision() -> None:
    # The Adds are 1% slower in int8, well inside the 3% margin: whatever the load and
    # jitter, the plan as asked is kept; the same model decided again gets the same plan.
    plans = set()
    for seed in range(25):
        backend = convs_and_adds(add_int8=0.303)
        backend.int8.update(c1=0.99, c2=0.99, c3=0.99)  # the whole plan is a tie with fp32
        decision = decide(backend, timer=fake_timer(backend, jitter=0.02, load=1.0, seed=seed))
        plans.add((tuple(decision.keep_float), decision.slower_than_float))
    assert plans == {((), False)}


def test_a_plan_slower_than_float_everywhere_is_flagged() -> None:
    backend = convs_and_adds(add_int8=0.6)
    backend.int8.update(c1=1.3, c2=1.3, c3=1.3)
    decision = decide(backend, timer=fake_timer(backend))
    assert decision.slower_than_float
    assert decision.keep_float == [name for name, _ in backend.ops()]
    assert decision.chosen_ms == decision.fp32_ms
    assert decision.best_quantized_ms is not None and decision.best_quantized_ms > (
        decision.fp32_ms or 0
    )
    assert decision.speedup == 1.0


def test_float_unless_faster_keeps_no_plan_measured_slower_within_the_noise() -> None:
    # a loaded machine: the plan is 10% slower than fp32, the noise wider than that
    seen_kept_slower = False
    for seed in range(5):
        backend = convs_and_adds(add_int8=0.5)
        backend.int8.update(c1=1.0, c2=1.0, c3=1.0)
        loose = decide(backend, timer=fake_timer(backend, jitter=0.3, seed=seed))
        strict = decide(
            backend, timer=fake_timer(backend, jitter=0.3, seed=seed), float_unless_faster=True
        )
        assert loose.speedup is not None and loose.noise > 0.1
        slower = not loose.slower_than_float and loose.speedup <= 1.0
        seen_kept_slower |= slower
        if slower or loose.slower_than_float:
            assert strict.slower_than_float and strict.keep_float == loose.ops
            assert strict.speedup == 1.0
        else:
            assert strict.keep_float == loose.keep_float
    assert seen_kept_slower, "the default rule keeps a plan measured slower (within noise)"


def test_segments_find_a_slow_stretch_of_one_op_type() -> None:
    # c1..c4 are slower in int8 (say, high-resolution 1x1 convs), c5..c7 faster; int8
    # Conv as a type still wins, so the op-type step keeps it: the segment rounds find
    # the slow half.
    ops = [(f"c{i}", "Conv") for i in range(1, 8)] + [("fc", "Gemm")]
    fp32 = {name: 1.0 for name, _ in ops}
    int8 = {name: 1.3 if name in ("c1", "c2", "c3", "c4") else 0.5 for name, _ in ops}
    backend = FakeBackend(ops, fp32, int8)
    decision = decide(backend, timer=fake_timer(backend))
    assert decision.keep_float == ["c1", "c2", "c3", "c4"]
    assert not next(s for s in decision.steps if s.change.startswith("Conv")).kept
    assert any(step.change.startswith("segment c1..c4") and step.kept for step in decision.steps)


def test_a_backend_profiler_blame_is_used() -> None:
    class Blaming(FakeBackend):
        def blame(self, candidate: frozenset[str], keep_float: frozenset[str]) -> list[str]:
            return [n for n, _ in self._ops if self.int8[n] > self.fp32[n] and n not in keep_float]

    ops = [("c1", "Conv"), ("c2", "Conv"), ("c3", "Conv"), ("fc", "Gemm")]
    backend = Blaming(
        ops,
        dict.fromkeys(("c1", "c2", "c3", "fc"), 1.0),
        {"c1": 0.5, "c2": 2.0, "c3": 0.5, "fc": 0.5},
    )
    decision = decide(backend, timer=fake_timer(backend))
    assert decision.keep_float == ["c2"]
    assert any("profiler blames" in step.change for step in decision.steps)


def test_nothing_quantized_needs_no_measurement() -> None:
    backend = FakeBackend([], {}, {})
    decision = decide(backend, timer=lambda c: pytest.fail("timed"))  # type: ignore[arg-type,return-value]
    assert decision.keep_float == [] and decision.steps == []


def test_a_decision_round_trips_through_json_and_the_disk_cache(tmp_path: Any) -> None:
    backend = convs_and_adds(add_int8=0.6)
    decision = decide(backend, timer=fake_timer(backend))
    again = Decision.from_json(decision.to_json())
    assert again.keep_float == decision.keep_float and again.steps == decision.steps
    ctx = latency_cache.context(
        framework="fake", framework_version="1", model_digest="abc", plan=["c1"],
        shapes=[[1, 8]], threads=1, margin=0.03,
    )  # fmt: skip
    assert ctx["isa"] == lpq.cpu_features().isa
    latency_cache.store(tmp_path, ctx, decision)
    latency_cache._memory.clear()  # as a new process would see it
    found = latency_cache.load(tmp_path, ctx)
    assert found is not None and found.cached and found.keep_float == ["a1", "a2"]
    other = dict(ctx, threads=4)
    assert latency_cache.load(tmp_path, other) is None


def test_slower_than_float_warns() -> None:
    import logging

    backend = convs_and_adds(add_int8=0.6)
    backend.int8.update(c1=1.3, c2=1.3, c3=1.3)
    decision = decide(backend, timer=fake_timer(backend))
    with pytest.warns(lpq.LpqWarning, match="slower than fp32"):
        announce(decision, "fake", logging.getLogger("test"))


def test_interleaved_timing_measures_paired_ratios() -> None:
    import time

    def sleeper(seconds: float) -> Any:
        return lambda: time.sleep(seconds)

    timing = interleaved(
        {"fast": sleeper(0.001), "slow": sleeper(0.003)}, min_rounds=5, max_rounds=5
    )
    assert timing.rounds == 5
    assert timing.ratio("slow", "fast") > 1.5  # sleep only ever oversleeps: no upper bound
    assert timing.noise("slow", "fast") >= 0.01


def test_noise_is_small_for_steady_and_large_for_erratic_pairs() -> None:
    steady = Timing({"a": [1.0, 1.1, 1.2, 0.9] * 5, "b": [2.0, 2.2, 2.4, 1.8] * 5})
    assert steady.ratio("b", "a") == pytest.approx(2.0)
    assert steady.noise("b", "a") == pytest.approx(0.01)  # the floor: the pairs agree
    erratic = Timing({"a": [1.0] * 20, "b": [1.0, 3.0] * 10})
    assert erratic.noise("b", "a") > 0.3


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), ("on", True), ("off", False), (0, False), (None, False)],
)
def test_the_latency_aware_option(value: Any, expected: bool) -> None:
    assert enabled({"latency_aware": value}) is expected


def test_a_bad_latency_aware_value_is_a_config_error() -> None:
    with pytest.raises(lpq.ConfigError, match="latency_aware"):
        enabled({"latency_aware": "sometimes"})
    with pytest.raises(lpq.ConfigError, match="latency_aware"):
        enabled({"latency_aware": 2})  # not a guess at its truth
    assert enabled({}) is False


# -- the optional steps: variants, alternatives, error tie rules, table, profile, fidelity --

Candidate = tuple[frozenset[str], str, frozenset[str]]


class ModeBackend:
    """A scripted backend with every optional method: a candidate is (float ops, variant,
    alternative ops); its time is the sum of per-op costs in each op's mode plus, per
    variant, a churn cost per float op (QDQ-like); its output error the sum of per-op
    errors. ``compare`` is the scripted timer (a fixed relative noise), and counts calls."""

    variant_name = "format"
    alternative_name = "dynamic"

    def __init__(
        self,
        ops: Sequence[tuple[str, str]],
        *,
        float_ms: Mapping[str, float],
        quant_ms: Mapping[str, Mapping[str, float]],
        alt_ms: Mapping[str, float] | None = None,
        churn: Mapping[str, float] | None = None,
        quant_error: Mapping[str, float] | None = None,
        alt_error: Mapping[str, float] | None = None,
        noise: float = 0.0,
        bulk: Sequence[str] = (),
        every: Sequence[str] = (),
    ) -> None:
        self._ops = list(ops)
        self.float_ms, self.quant_ms = dict(float_ms), {k: dict(v) for k, v in quant_ms.items()}
        self.alt_ms = dict(alt_ms or {})
        self.churn = dict(churn or {})
        self.quant_error, self.alt_error = dict(quant_error or {}), dict(alt_error or {})
        self.noise, self.bulk, self.every = noise, list(bulk), list(every)
        self.compared: list[tuple[Candidate, Candidate]] = []
        self.built: list[Candidate] = []
        self.rules = lpq.latency.Rules(clear_win=None, segments=False, final_margin=None)

    def ops(self) -> list[tuple[str, str]]:
        return self._ops

    def variants(self) -> list[str]:
        return list(self.quant_ms)

    def alternatives(self, every: bool = False) -> list[str]:
        return self.every if every else self.bulk

    def build(self, keep: frozenset[str], variant: str, alternative: frozenset[str]) -> Candidate:
        self.built.append((keep, variant, alternative))
        return (keep, variant, alternative)

    def runner(self, candidate: Candidate) -> Any:
        raise AssertionError("compared by the backend, never run")

    def ms(self, candidate: Candidate) -> float:
        keep, variant, alt = candidate
        total = 0.1
        for name, _ in self._ops:
            if name in keep:
                total += self.float_ms[name] + self.churn.get(variant, 0.0)
            elif name in alt:
                total += self.alt_ms[name]
            else:
                total += self.quant_ms[variant][name]
        return total

    def error(self, candidate: Candidate) -> float:
        keep, _, alt = candidate
        return 1e-3 + sum(
            self.alt_error.get(n, 0.0) if n in alt else self.quant_error.get(n, 0.0)
            for n, _ in self._ops
            if n not in keep
        )

    def compare(self, current: Candidate, candidate: Candidate, edges: Sequence[float]) -> Any:
        from lpq.latency import Comparison

        self.compared.append((current, candidate))
        before, after = self.ms(current), self.ms(candidate)
        ratio = after / before
        return Comparison(before, after, ratio, ratio * (1.0 + self.noise), rounds=10)


def _without(backend: ModeBackend, *names: str) -> ModeBackend:
    """``backend`` with the optional methods ``names`` switched off (None)."""
    for name in names:
        setattr(backend, name, None)
    return backend


def _chain(**quant: float) -> dict[str, Any]:
    """Convs c1, c2 and Adds a1, a2 (float 1.0 ms each); ``quant``: per-op int8 ms."""
    ops = [("c1", "Conv"), ("a1", "Add"), ("c2", "Conv"), ("a2", "Add")]
    return {"ops": ops, "float_ms": dict.fromkeys(("c1", "a1", "c2", "a2"), 1.0), "q": quant}


def test_a_faster_variant_is_kept() -> None:
    parts = _chain()
    quant = {
        "qdq": dict.fromkeys(("c1", "a1", "c2", "a2"), 0.6),
        "qop": dict.fromkeys(("c1", "a1", "c2", "a2"), 0.4),
    }
    backend = _without(
        ModeBackend(parts["ops"], float_ms=parts["float_ms"], quant_ms=quant), "error"
    )
    decision = decide(backend)
    assert decision.variant == "qop" and decision.keep_float == []
    changes = [(s.change, s.kept) for s in decision.steps]
    assert changes[0] == ("format qdq -> qop", True)
    assert changes[-1] == ("result -> every op float", False)


def test_each_other_variant_gets_its_own_op_types() -> None:
    """Both variants run alike with every op quantized; in qdq the slow Adds back in float
    pay churn, in qop they do not: qop wins with its Adds in float."""
    parts = _chain()
    ms = {"c1": 0.5, "c2": 0.5, "a1": 2.0, "a2": 2.0}
    backend = _without(
        ModeBackend(
            parts["ops"],
            float_ms=parts["float_ms"],
            quant_ms={"qdq": ms, "qop": ms},
            churn={"qdq": 1.5},
        ),
        "error",
    )
    decision = decide(backend)
    assert decision.variant == "qop" and decision.keep_float == ["a1", "a2"]
    changes = [(s.change, s.kept) for s in decision.steps]
    assert ("format qdq -> qop", False) in changes
    assert ("qdq: Add (2 ops) -> float", False) in changes
    assert ("format qdq -> qop, its op types", True) in changes


def _mlp(alt: float, **kw: Any) -> ModeBackend:
    ops = [("mm1", "MatMul"), ("mm2", "MatMul"), ("add", "Add")]
    return ModeBackend(
        ops,
        float_ms={"mm1": 2.0, "mm2": 2.0, "add": 0.2},
        quant_ms={"qdq": {"mm1": 1.0, "mm2": 1.0, "add": 0.5}},
        alt_ms={"mm1": alt, "mm2": alt, "add": 0.5},
        bulk=["mm1", "mm2"],
        **kw,
    )


def test_alternatives_are_kept_when_faster_and_the_ops_beside_them_go_float() -> None:
    backend = _without(_mlp(alt=0.6), "error")
    decision = decide(backend)
    assert decision.alternative == ["mm1", "mm2"] and decision.keep_float == ["add"]
    changes = [(s.change, s.kept) for s in decision.steps]
    assert changes[:2] == [
        ("2 ops -> dynamic", True),
        ("1 ops beside those in dynamic -> float", True),
    ]
    kept = next(s for s in decision.steps if s.kept)
    assert kept.alternative == ["mm1", "mm2"] and kept.variant == "qdq"


@pytest.mark.parametrize(
    ("alt_ms", "alt_error", "kept"),
    [
        (1.05, 0.05, True),  # 5% slower (within the tie), error 0.2 -> 0.1: more faithful
        (1.0, 0.098, False),  # as fast, error only 2% lower: noise, not a gain
        (1.08, 0.04, True),  # a little slower, far more faithful (error under half)
        (1.15, 0.0, False),  # beyond the tie: slower, whatever the fidelity
    ],
)
def test_the_tie_rule_keeps_an_alternative_as_fast_and_more_faithful(
    alt_ms: float, alt_error: float, kept: bool
) -> None:
    backend = _mlp(
        alt=alt_ms,
        quant_error={"mm1": 0.1, "mm2": 0.1},
        alt_error={"mm1": alt_error, "mm2": alt_error},
    )
    backend.float_ms["add"] = 0.5  # the add beside them gains nothing in float
    decision = decide(backend)
    first = decision.steps[0]
    assert first.change == "2 ops -> dynamic" and first.kept is kept
    # the errors are measured within the tie band only (``Rules.tie``)
    assert (first.error_before is not None and first.error_after is not None) is (alt_ms < 1.1)
    assert decision.alternative == (["mm1", "mm2"] if kept else [])


def test_without_error_the_tie_rule_never_keeps_a_slower_alternative() -> None:
    backend = _without(_mlp(alt=1.05, alt_error={"mm1": 0.0, "mm2": 0.0}), "error")
    decision = decide(backend)
    assert not decision.steps[0].kept and decision.steps[0].error_before is None
    assert decision.alternative == []


@pytest.mark.parametrize(("gemm_int8", "kept"), [(1.1, False), (1.5, True)])
def test_a_faster_but_less_faithful_change_needs_a_clear_win(gemm_int8: float, kept: bool) -> None:
    """Gemm back in float is faster but *raises* the output error (here float ops add
    error): a 5% gain is timing noise, a 1.4x one a clear win."""
    ops = [("c1", "Conv"), ("c2", "Conv"), ("g", "Gemm")]
    backend = ModeBackend(
        ops,
        float_ms={"c1": 1.0, "c2": 1.0, "g": 1.0},
        quant_ms={"qdq": {"c1": 0.5, "c2": 0.5, "g": gemm_int8}},
        quant_error={"c1": 0.3, "c2": 0.3, "g": -0.3},
    )
    backend.rules = replace(backend.rules, fidelity_max_ops=0)
    decision = decide(backend)
    step = next(s for s in decision.steps if s.change.startswith("qdq: Gemm"))
    assert step.ratio is not None and step.ratio < 1 - 0.03  # faster by the margin ...
    assert step.error_after is not None and step.error_before is not None
    assert step.error_after > step.error_before * 1.05  # ... and less faithful
    assert step.kept is kept and (decision.keep_float == ["g"]) is kept


@pytest.mark.parametrize(("gain", "kept"), [(0.02, False), (0.5, True)])
def test_a_change_that_buys_no_speed_needs_a_real_fidelity_gain(gain: float, kept: bool) -> None:
    ops = [("c1", "Conv"), ("c2", "Conv"), ("a1", "Add")]
    backend = ModeBackend(
        ops,
        float_ms={"c1": 1.0, "c2": 1.0, "a1": 0.5},
        quant_ms={"qdq": {"c1": 0.5, "c2": 0.5, "a1": 0.5}},
        quant_error={"c1": 0.0, "c2": 0.0, "a1": gain * 0.1},
    )
    backend.quant_error["c1"] = (1 - gain) * 0.1  # the rest of the error stays
    backend.rules = replace(backend.rules, fidelity_max_ops=0)
    decision = decide(backend)
    step = next(s for s in decision.steps if s.change == "qdq: Add (1 ops) -> float")
    assert step.ratio == pytest.approx(1.0)
    assert step.kept is kept and (decision.keep_float == ["a1"]) is kept


@pytest.mark.parametrize("noise", [0.0, 0.02, 0.05])
def test_a_fidelity_tie_is_decided_on_the_ratio_whatever_the_noise(noise: float) -> None:
    """An Add 1.25% slower in float that cuts the output error by 30% is kept at every
    load: the tie rule reads the ratio, not its bound (at the bound, x1.0125 plus a noise
    of 2% or more crossed the 3% edge, and the plan followed the load of the moment).
    One 6% slower is rejected at every load."""
    for float_ms, kept in ((0.52, True), (0.6, False)):
        ops = [("c1", "Conv"), ("c2", "Conv"), ("a1", "Add")]
        backend = ModeBackend(
            ops,
            float_ms={"c1": 1.0, "c2": 1.0, "a1": float_ms},
            quant_ms={"qdq": {"c1": 0.5, "c2": 0.5, "a1": 0.5}},
            quant_error={"c1": 0.07, "c2": 0.0, "a1": 0.03},
            noise=noise,
        )
        backend.rules = replace(backend.rules, fidelity_max_ops=0)
        decision = decide(backend)
        step = next(s for s in decision.steps if s.change == "qdq: Add (1 ops) -> float")
        assert step.ratio is not None and 1.0 < step.ratio < 1.07
        assert step.error_after is not None and step.error_before is not None
        assert 0.5 < step.error_after / step.error_before < 0.9
        assert step.kept is kept and (decision.keep_float == ["a1"]) is kept


def test_the_op_table_keeps_a_type_quantized_without_timing_it() -> None:
    from lpq.latency import Verdict

    parts = _chain(c1=0.3, c2=0.3, a1=2.0, a2=2.0)
    backend = _without(
        ModeBackend(parts["ops"], float_ms=parts["float_ms"], quant_ms={"qdq": parts["q"]}),
        "error",
        "slowdown",
    )
    asked: list[tuple[str, ...]] = []

    def verdict(names: Sequence[str], variant: str, candidate: Any, keep: Any) -> Any:
        asked.append(tuple(names))
        if names == ["c1", "c2"]:
            return Verdict(quantize=True, low=0.3, high=0.35)
        return Verdict(quantize=False, low=1.8, high=2.2)  # that direction is timed

    backend.verdict = verdict  # type: ignore[assignment]
    decision = decide(backend)
    assert decision.keep_float == ["a1", "a2"]
    untimed = [s for s in decision.steps if s.note is not None]
    assert [s.change for s in untimed] == ["qdq: Conv (2 ops) -> float"]
    assert untimed[0].before_ms is None and not untimed[0].kept
    assert "op latency table" in untimed[0].note  # type: ignore[operator]
    timed = [s.change for s in decision.steps if s.before_ms is not None]
    assert timed == ["qdq: Add (2 ops) -> float", "result -> every op float"]
    assert len(backend.compared) == 2  # Add and the final step; Conv never timed
    assert asked == [("c1", "c2"), ("a1", "a2")]


def test_the_op_table_is_not_asked_with_alternatives_in_the_plan() -> None:
    backend = _without(_mlp(alt=0.6), "error", "slowdown")
    backend.verdict = lambda *a: pytest.fail("asked")  # type: ignore[assignment]
    decision = decide(backend)
    assert decision.alternative == ["mm1", "mm2"]
    assert all(s.note is None for s in decision.steps)


def test_a_type_the_profile_predicts_much_slower_in_float_is_not_timed() -> None:
    parts = _chain(c1=0.5, c2=0.5, a1=0.5, a2=0.5)
    backend = _without(
        ModeBackend(parts["ops"], float_ms=parts["float_ms"], quant_ms={"qdq": parts["q"]}),
        "error",
        "verdict",
    )
    backend.slowdown = lambda names, c, k: 1.0 if names == ["c1", "c2"] else 0.05  # type: ignore[assignment]
    decision = decide(backend)
    predicted = [s for s in decision.steps if s.note is not None]
    assert [s.change for s in predicted] == ["qdq: Conv (2 ops) -> float"]
    assert "profile" in (predicted[0].note or "") and predicted[0].before_ms is None
    assert "qdq: Add (2 ops) -> float" in [s.change for s in decision.steps if s.before_ms]
    # at the threshold (0.2) it is trusted; under it, timed
    backend.slowdown = lambda names, c, k: 0.19  # type: ignore[assignment]
    assert all(s.note is None for s in decide(backend).steps)


def _tiny_adds(add_error: float) -> ModeBackend:
    """Convs that int8 makes faster and Adds it leaves as fast, whose float move the
    profile bounds at 1% of the model's time (the Convs' at 50%); ``add_error``: the
    output error the Adds' int8 adds (the Convs add 0.1)."""
    parts = _chain(c1=0.5, c2=0.5, a1=1.0, a2=1.0)
    backend = _without(
        ModeBackend(
            parts["ops"],
            float_ms=parts["float_ms"],
            quant_ms={"qdq": parts["q"]},
            quant_error={"c1": 0.05, "c2": 0.05, "a1": add_error / 2, "a2": add_error / 2},
        ),
        "verdict",
        "slowdown",
    )
    backend.rules = replace(backend.rules, least_gain=0.5, fidelity_max_ops=0)
    backend.gain_bound = lambda names, c, k: 0.01 if names == ["a1", "a2"] else 0.5  # type: ignore[attr-defined]
    return backend


def test_a_type_that_cannot_win_by_the_margin_is_not_timed() -> None:
    backend = _tiny_adds(add_error=0.001)
    decision = decide(backend)
    step = next(s for s in decision.steps if s.change == "qdq: Add (2 ops) -> float")
    assert step.before_ms is None and not step.kept
    assert "at most 1.0% faster" in (step.note or "")
    # its output errors were read (a fidelity gain would have had it timed) ...
    assert step.error_before is not None and step.error_after is not None
    assert step.error_after > step.error_before * 0.9
    # ... and it was never compared; the Convs (bound 50%) were
    compared = {candidate[0] for _, candidate in backend.compared}
    assert frozenset({"a1", "a2"}) not in compared
    assert frozenset({"c1", "c2"}) in compared
    # a bound at the threshold (half the 3% margin) is timed
    backend.gain_bound = lambda names, c, k: 0.015  # type: ignore[attr-defined]
    assert all(s.note is None for s in decide(backend).steps)


def test_a_type_that_cannot_win_on_speed_is_timed_when_it_cuts_the_error() -> None:
    """The Adds' int8 doubles the output error: back in float as fast, they are kept for
    fidelity, which needs the timing that says "as fast"."""
    backend = _tiny_adds(add_error=0.2)
    decision = decide(backend)
    step = next(s for s in decision.steps if s.change == "qdq: Add (2 ops) -> float")
    assert step.note is None and step.before_ms is not None
    assert step.kept and decision.keep_float == ["a1", "a2"]


def _small_types(cut: str | None = None) -> ModeBackend:
    """Convs c1, c2 that int8 makes faster, and one Add, one Sigmoid and one Concat that
    it leaves as fast, whose float moves the profile bounds at 1% (the Convs' at 50%);
    each small op adds 0.001 output error in int8, or ``cut`` adds 0.2."""
    ops = [("c1", "Conv"), ("c2", "Conv"), ("add", "Add"), ("sig", "Sigmoid"), ("cat", "Concat")]
    small = {"add", "sig", "cat"}
    backend = _without(
        ModeBackend(
            ops,
            float_ms=dict.fromkeys(("c1", "c2", *small), 1.0),
            quant_ms={"qdq": {"c1": 0.5, "c2": 0.5, "add": 1.0, "sig": 1.0, "cat": 1.0}},
            quant_error={"c1": 0.05, "c2": 0.05, **{n: 0.2 if n == cut else 0.001 for n in small}},
        ),
        "verdict",
        "slowdown",
    )
    backend.rules = replace(backend.rules, least_gain=0.5, fidelity_max_ops=0)
    backend.gain_bound = lambda names, c, k: 0.01 if set(names) <= small else 0.5  # type: ignore[attr-defined]
    return backend


def test_op_types_that_cannot_win_are_checked_for_fidelity_together() -> None:
    """Three small types the profile bounds: one build with all three in float reads the
    output error for them, and none is built or timed alone."""
    backend = _small_types()
    decision = decide(backend)
    notes = [s for s in decision.steps if s.note and "at most 1.0% faster" in s.note]
    assert [s.change for s in notes] == [
        f"qdq: {t} (1 ops) -> float" for t in ("Add", "Sigmoid", "Concat")
    ]
    assert all("with 3 such op types in float" in (s.note or "") for s in notes)
    built = [keep for keep, _, _ in backend.built]
    assert frozenset({"add", "sig", "cat"}) in built
    assert not {frozenset({"add"}), frozenset({"sig"}), frozenset({"cat"})} & set(built)
    compared = {candidate[0] for _, candidate in backend.compared}
    assert not {frozenset({"add"}), frozenset({"sig"}), frozenset({"cat"})} & compared
    assert decision.keep_float == []


def test_a_type_that_cuts_the_error_is_found_alone_when_the_types_together_cut_it() -> None:
    """The Sigmoid's int8 is most of the output error: together the three cut it, so each
    is measured alone; the Sigmoid is timed and kept for fidelity, the others are not."""
    backend = _small_types(cut="sig")
    decision = decide(backend)
    steps = {s.change: s for s in decision.steps}
    add, sig = steps["qdq: Add (1 ops) -> float"], steps["qdq: Sigmoid (1 ops) -> float"]
    assert add.before_ms is None and add.error_after is not None  # measured alone
    assert sig.before_ms is not None and sig.kept  # timed, as fast and more faithful
    assert decision.keep_float == ["sig"]
    # After the Sigmoid is kept the model changed: the Concat is read again, alone
    # (the only such type left), and not timed.
    cat = steps["qdq: Concat (1 ops) -> float"]
    assert cat.before_ms is None and cat.error_after is not None


class _EdgesSeen(ModeBackend):
    """A :class:`ModeBackend` that records the edges of every comparison."""

    def compare(self, current: Candidate, candidate: Candidate, edges: Sequence[float]) -> Any:
        self.edges_seen = [*getattr(self, "edges_seen", []), (candidate[0], tuple(edges))]
        return super().compare(current, candidate, edges)


@pytest.mark.parametrize(("add_error", "timed_twice"), [(0.001, False), (0.2, True)])
def test_the_as_fast_edge_is_timed_only_for_a_change_that_cuts_the_error(
    add_error: float, timed_twice: bool
) -> None:
    """A tie step decides "as fast" (1 + tie) only for a change that cuts the output
    error: the timer is first given the other edges, and again with that one only when
    the errors say it decides."""
    parts = _chain(c1=0.5, c2=0.5, a1=1.0, a2=1.0)
    backend = _EdgesSeen(
        parts["ops"],
        float_ms=parts["float_ms"],
        quant_ms={"qdq": parts["q"]},
        quant_error={"c1": 0.05, "c2": 0.05, "a1": add_error / 2, "a2": add_error / 2},
    )
    backend.rules = replace(backend.rules, fidelity_max_ops=0)
    decide(_without(backend, "verdict", "slowdown"))
    adds = [edges for keep, edges in backend.edges_seen if keep == frozenset({"a1", "a2"})]
    margin = backend.rules.margin
    assert len(adds) == (2 if timed_twice else 1)
    assert 1.0 + margin not in adds[0] and 1.0 - margin == adds[0][0]
    if timed_twice:
        assert 1.0 + margin in adds[1]


def test_an_alternative_that_cuts_the_error_is_timed_once() -> None:
    """The alternative-mode step's tie is ``Rules.tie``: its "as fast" edge (1 + tie) is
    among the first comparison's edges already, so a change that cuts the error is not
    timed a second time (MiniLM's dynamic step was, 50-100 rounds each)."""
    backend = _EdgesSeen(
        [("mm1", "MatMul"), ("mm2", "MatMul"), ("add", "Add")],
        float_ms={"mm1": 2.0, "mm2": 2.0, "add": 0.5},
        quant_ms={"qdq": {"mm1": 1.0, "mm2": 1.0, "add": 0.5}},
        alt_ms={"mm1": 1.0, "mm2": 1.0, "add": 0.5},
        quant_error={"mm1": 0.1, "mm2": 0.1},
        alt_error={"mm1": 0.04, "mm2": 0.04},
        bulk=["mm1", "mm2"],
    )
    decision = decide(backend)
    first = decision.steps[0]
    assert first.change == "2 ops -> dynamic" and first.kept  # as fast, more faithful
    timed = [edges for keep, edges in backend.edges_seen if keep == frozenset()]
    tie = backend.rules.tie
    assert len(timed) == 1 and 1.0 + tie in timed[0]


def test_only_a_blame_round_is_timed_against_the_loss_that_ends_the_rounds() -> None:
    """1 + margin (a blame round that loses by it ends the rounds) decides nothing for a
    format or the final step: a near-tie about 1.0 is not timed against it there."""
    parts = _chain(c1=0.5, c2=0.5, a1=1.0, a2=1.0)
    quant = {"qdq": parts["q"], "qop": parts["q"]}
    backend = _EdgesSeen(parts["ops"], float_ms=parts["float_ms"], quant_ms=quant)
    backend.blame = lambda candidate, keep: ["a1"]  # type: ignore[attr-defined]
    decision = decide(_without(backend, "error", "verdict", "slowdown"))
    margin = backend.rules.margin
    edges = dict(
        zip(
            [s.change for s in decision.steps if s.before_ms is not None],
            [e for _, e in backend.edges_seen],
            strict=True,
        )
    )
    assert 1.0 + margin not in edges["format qdq -> qop"]
    assert 1.0 + margin not in edges["result -> every op float"]
    assert 1.0 + margin in edges["qdq: 1 ops the profiler blames -> float"]


def _blamed(costs: Any) -> ModeBackend:
    ops = [("c1", "Conv"), ("c2", "Conv"), ("f1", "Gemm"), ("f2", "Gemm")]
    backend = _without(
        ModeBackend(
            ops,
            float_ms=dict.fromkeys(("c1", "c2", "f1", "f2"), 1.0),
            quant_ms={"qdq": dict.fromkeys(("c1", "c2", "f1", "f2"), 0.5)},
        ),
        "error",
        "verdict",
        "slowdown",
    )
    backend.ms = lambda candidate: 0.1 + sum(costs(candidate[0]).values())  # type: ignore[method-assign]
    backend.blamed_calls = 0  # type: ignore[attr-defined]

    def blame(candidate: Candidate, keep: frozenset[str]) -> list[str]:
        backend.blamed_calls += 1  # type: ignore[attr-defined]
        each = costs(keep, split=True)
        return [n for n, (fp, q) in each.items() if n not in keep and q > fp]

    backend.blame = blame  # type: ignore[attr-defined]
    return backend


def test_a_blame_round_that_gains_nothing_is_built_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """f1 back in float saves what c1 then loses (c1 is fast only while f1 reads its int8
    output): round one is a wash, round two blames c1, both in float win. Before each
    profile the search lets go of the output errors of all but the profiled, compared
    and current models."""

    def costs(keep: frozenset[str], split: bool = False) -> Any:
        each = {n: (1.0, 0.5) for n in ("c1", "c2", "f1", "f2")}
        each |= {"c2": (1.0, 0.05), "f1": (1.0, 1.6), "c1": (1.0, 0.9 if "f1" not in keep else 1.5)}
        if split:
            return each
        return {n: each[n][0] if n in keep else each[n][1] for n in each}

    backend = _blamed(costs)
    profiled = backend.blame
    forgotten: list[tuple[int, int]] = []

    def blame(candidate: Candidate, keep: frozenset[str]) -> list[str]:
        assert len(forgotten) == backend.blamed_calls + 1  # errors let go just before
        assert candidate in forgotten_models[-1]
        return profiled(candidate, keep)

    forgotten_models: list[tuple[Any, ...]] = []
    original = Judge.forget_errors_except

    def forget(self: Judge, *models: Any) -> None:
        forgotten.append((len(models), backend.blamed_calls))
        forgotten_models.append(models)
        original(self, *models)

    backend.blame = blame  # type: ignore[attr-defined]
    monkeypatch.setattr(Judge, "forget_errors_except", forget)
    decision = decide(backend)
    rounds = [(s.change, s.kept) for s in decision.steps if "blames" in s.change]
    assert rounds == [
        ("qdq: 1 ops the profiler blames -> float", False),
        ("qdq: 1 ops the profiler blames -> float", True),
    ]
    assert decision.keep_float == ["c1", "f1"]
    assert len(forgotten) == backend.blamed_calls == 2


def test_blame_rounds_stop_at_a_round_that_loses() -> None:
    """Round one (f1 to float) loses by more than the margin: no second profile."""

    def costs(keep: frozenset[str], split: bool = False) -> Any:
        each = {n: (1.0, 0.5) for n in ("c1", "c2", "f1", "f2")}
        each |= {"c2": (1.0, 0.05), "f1": (3.0, 1.1), "c1": (1.0, 0.9 if "f1" not in keep else 1.5)}
        if split:  # the profiler wrongly blames f1
            return each | {"f1": (1.0, 1.1)}
        return {n: each[n][0] if n in keep else each[n][1] for n in each}

    backend = _blamed(costs)
    decision = decide(backend)
    rounds = [(s.change, s.kept) for s in decision.steps if "blames" in s.change]
    assert rounds == [("qdq: 1 ops the profiler blames -> float", False)]
    assert backend.blamed_calls == 1 and decision.keep_float == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(("c1_after", "rounds"), [(1.5, 2), (1.53, 2), (1.56, 1)])
def test_a_blame_round_measured_slower_ends_the_rounds(c1_after: float, rounds: int) -> None:
    """As above, but c1 loses a little more than f1 saves: x1.000 and x1.010 (within
    ``Rules.blame_slower``) are built on; x1.019 is slower, and no second profile is
    taken (ddddocr rec: QOperator rounds at x1.024-1.029 were three profiles for
    nothing)."""

    def costs(keep: frozenset[str], split: bool = False) -> Any:
        each = {n: (1.0, 0.5) for n in ("c1", "c2", "f1", "f2")}
        c1 = 0.9 if "f1" not in keep else c1_after
        each |= {"c2": (1.0, 0.05), "f1": (1.0, 1.6), "c1": (1.0, c1)}
        if split:
            return each
        return {n: each[n][0] if n in keep else each[n][1] for n in each}

    backend = _blamed(costs)
    decision = decide(backend)
    first = next(s for s in decision.steps if "blames" in s.change)
    assert first.ratio == pytest.approx((c1_after + 1.65) / 3.15, abs=1e-3)
    assert backend.blamed_calls == rounds  # type: ignore[attr-defined]
    assert decision.keep_float == (["c1", "f1"] if rounds == 2 else [])


def test_the_fidelity_step_moves_ops_that_cost_error_for_little_speed() -> None:
    """Small model: a1 alone in float cuts the output error by far and costs nothing: it
    goes to float (no alternative for it)."""
    parts = _chain(c1=0.5, c2=0.5, a1=1.0, a2=0.5)
    backend = ModeBackend(
        parts["ops"],
        float_ms=parts["float_ms"],
        quant_ms={"qdq": parts["q"]},
        quant_error={"a1": 0.2, "c1": 0.01},
    )
    decision = decide(backend)
    # the Add type as a whole was slower in float (a2 is fast quantized): not kept there
    assert not next(s for s in decision.steps if "Add" in s.change).kept
    step = next(s for s in decision.steps if "fidelity" in s.change)
    assert step.change == "1 ops that cost fidelity -> float" and step.kept
    assert decision.keep_float == ["a1"]
    # Too many ops for the step (the model is not small): nothing is tried.
    backend.rules = replace(backend.rules, fidelity_max_ops=3)
    assert not any("fidelity" in s.change for s in decide(backend).steps)


def test_the_fidelity_step_prefers_the_alternative_mode() -> None:
    parts = _chain(c1=0.5, c2=0.5, a1=1.0, a2=0.5)
    backend = ModeBackend(
        parts["ops"],
        float_ms=parts["float_ms"],
        quant_ms={"qdq": parts["q"]},
        alt_ms={"a1": 1.0},
        quant_error={"a1": 0.2, "c1": 0.01},
        alt_error={"a1": 0.0},
        every=["a1"],
    )
    decision = decide(backend)
    assert decision.alternative == ["a1"] and decision.keep_float == []
    assert ("1 ops that cost fidelity -> dynamic", True) in [
        (s.change, s.kept) for s in decision.steps
    ]
    # An alternative the backend cannot build: float after all.
    build = backend.build

    def failing(keep: frozenset[str], variant: str, alt: frozenset[str]) -> Candidate:
        if alt:
            raise lpq.ModelError("no dynamic kernel")
        return build(keep, variant, alt)

    backend.build = failing  # type: ignore[method-assign]
    decision = decide(backend)
    assert decision.alternative == [] and decision.keep_float == ["a1"]


@pytest.mark.parametrize(("final_margin", "to_float"), [(None, False), (0.0, True)])
def test_the_final_step_with_a_margin(final_margin: float | None, to_float: bool) -> None:
    """The result 2% slower than fp32: back to float when fp32 must only win (core), kept
    when fp32 must win by the margin (lpq-onnxrt's rules)."""
    parts = _chain(c1=1.0, c2=1.0, a1=1.0, a2=1.0)
    parts["q"] = {n: 1.02 for n in parts["q"] or ("c1", "c2", "a1", "a2")}
    backend = _without(
        ModeBackend(parts["ops"], float_ms=parts["float_ms"], quant_ms={"qdq": parts["q"]}),
        "error",
    )
    backend.rules = replace(backend.rules, final_margin=final_margin)
    decision = decide(backend)
    assert decision.slower_than_float is to_float
    assert decision.keep_float == (["c1", "a1", "c2", "a2"] if to_float else [])
    assert decision.planned_ms is None and decision.planned_speedup is None  # no step 1


def test_output_errors_are_remembered_for_the_last_few_models_only() -> None:
    """The current model's error is computed once however often it is compared; the
    search holds at most ``KEPT_ERRORS`` models for their errors (each is a whole
    quantized copy), and a model asked again after that is measured again."""
    from lpq.latency.judging import KEPT_ERRORS, Judge

    parts = _chain(c1=0.5, c2=0.5, a1=1.0, a2=0.5)
    backend = ModeBackend(
        parts["ops"], float_ms=parts["float_ms"], quant_ms={"qdq": parts["q"]}, quant_error={}
    )
    measured: list[Candidate] = []
    error = backend.error

    def counted(candidate: Candidate) -> float:
        measured.append(candidate)
        return error(candidate)

    backend.error = counted  # type: ignore[method-assign]
    judge = Judge(backend, backend.compare, backend.rules, None)
    current: Candidate = (frozenset(), "qdq", frozenset())
    others = [(frozenset({name}), "qdq", frozenset()) for name in ("c1", "a1", "c2", "a2")]
    for other in others:
        judge.errors(current)
        judge.errors(other)
    assert measured.count(current) == 1 and len(measured) == 1 + len(others)
    assert len(judge._errors) <= KEPT_ERRORS
    judge.errors(others[0])  # long forgotten: measured again, with the same result
    assert measured.count(others[0]) == 2


def test_only_each_variants_plan_is_kept_built_without_keep_builds() -> None:
    parts = _chain(c1=0.5, c2=0.5, a1=2.0, a2=2.0)
    backend = _without(
        ModeBackend(parts["ops"], float_ms=parts["float_ms"], quant_ms={"qdq": parts["q"]}),
        "error",
    )
    backend.rules = replace(backend.rules, keep_builds=False)
    decide(backend)
    plain = [c for c in backend.built if not c[0] and not c[2]]
    assert len(plain) == 1  # the plan as asked once; the rest as often as asked


def test_each_variants_plan_is_let_go_once_an_op_has_left_it() -> None:
    """Without keep_builds, the plans as asked are held only while the search may ask for
    them again: once an op is in float or in the alternative mode, it never does."""
    from lpq.latency.judging import Judge

    parts = _chain(c1=0.5, c2=0.5, a1=2.0, a2=2.0)
    backend = _without(
        ModeBackend(parts["ops"], float_ms=parts["float_ms"], quant_ms={"qdq": parts["q"]}),
        "error",
    )
    backend.rules = replace(backend.rules, keep_builds=False)
    judge = Judge(backend, backend.compare, backend.rules, None)
    plan = judge.build(frozenset(), "qdq", frozenset())
    assert judge.build(frozenset(), "qdq", frozenset()) is plan and judge._built
    judge.keep = frozenset({"c1"})
    judge.build(frozenset({"c1", "c2"}), "qdq", frozenset())
    assert not judge._built
    kept = replace(backend.rules, keep_builds=True)
    judge = Judge(backend, backend.compare, kept, None)
    judge.build(frozenset(), "qdq", frozenset())
    judge.keep = frozenset({"c1"})
    judge.build(frozenset({"c1", "c2"}), "qdq", frozenset())
    assert len(judge._built) == 2


def test_a_decision_with_variant_and_alternatives_round_trips_through_json() -> None:
    backend = _without(_mlp(alt=0.6), "error")
    backend.verdict = lambda *a: None  # type: ignore[assignment]
    decision = decide(backend)
    again = Decision.from_json({**decision.to_json(), "unknown": 1})
    assert again.variant == "qdq" and again.alternative == ["mm1", "mm2"]
    assert again.steps == decision.steps
    assert "1 of 3 ops kept in float, 2 in the alternative mode (qdq)" in again.summary()


def test_a_timer_is_pooled_near_the_deciding_edge_only() -> None:
    from lpq.latency import pooled

    calls: list[int] = []

    def timer(ratio: float) -> Any:
        def timed(candidates: Mapping[str, Any]) -> Timing:
            calls.append(1)
            return Timing({"current": [1.0, 1.02, 0.98] * 5, "candidate": [ratio] * 15})

        return timed

    compare = pooled(timer(0.975))  # within its noise of 0.97: timed again, twice
    found = compare("a", "b", (0.97, 0.9, 1.03))
    assert len(calls) == 3 and found.rounds == 45 and found.high > found.ratio
    calls.clear()
    pooled(timer(0.5))("a", "b", (0.97, 0.5))  # far from 0.97 (near another edge): once
    assert len(calls) == 1


def test_the_sequential_statistic_stops_once_clear_and_bounds_the_ratio_above() -> None:
    """Core's sequential compare (lpq-onnxrt's timer) on scripted runs: a 2x win is clear
    after its minimum rounds; its pessimistic bound lies above the median ratio."""
    from lpq.latency import sequential_compare
    from lpq.latency.timing import HIGH, MIN_ROUNDS

    rng = random.Random(0)
    rounds = {"n": 0}

    def run(seconds: float) -> Any:
        def once() -> float:
            rounds["n"] += 1
            return seconds * (1.0 + 0.05 * rng.random())

        return once

    found = sequential_compare({"current": run(1.0), "candidate": run(0.5)}, edges=(0.97,))
    assert rounds["n"] // 2 == MIN_ROUNDS
    assert found["candidate"] / found["current"] == pytest.approx(0.5, rel=0.05)
    assert found[HIGH] > found["candidate"]


def test_a_profile_lets_go_of_the_other_models_errors() -> None:
    """Before the profiler runs (two sessions at once), the search keeps the output
    errors, and with them the models, of the profiled, the compared and the current
    model only (MiniLM's QOperator search: peak 944 -> 887 MB with the adaptor's part)."""
    import gc
    import weakref

    class Model:
        pass

    class Erring:
        def ops(self) -> list[tuple[str, str]]:
            return [("c1", "Conv")]

        def error(self, model: Model) -> float:
            return 0.5

    judge = Judge(Erring(), lambda *a: None, lpq.latency.Rules(), None)  # type: ignore[arg-type]
    models = [Model() for _ in range(3)]
    for each in models:
        judge.errors(each)
    del each
    refs = [weakref.ref(model) for model in models]
    judge.forget_errors_except(models[1])
    del models
    gc.collect()
    assert [ref() is not None for ref in refs] == [False, True, False]
