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
from typing import Any

import pytest

import lpq
from lpq.latency import Decision, Timing, decide, enabled, interleaved
from lpq.latency import cache as latency_cache
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
    ("value", "expected"), [(True, True), (False, False), ("on", True), ("off", False), (0, False)]
)
def test_the_latency_aware_option(value: Any, expected: bool) -> None:
    assert enabled({"latency_aware": value}) is expected


def test_a_bad_latency_aware_value_is_a_config_error() -> None:
    with pytest.raises(lpq.ConfigError, match="latency_aware"):
        enabled({"latency_aware": "sometimes"})
    assert enabled({}) is False
