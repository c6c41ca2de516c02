"""Latency decisions that hold on a loaded machine, and what they cost.

The timings here are scripted (no clock): each run of a model takes its cost, the sum of
its ops' fp32 or int8 costs, times the machine's load at that moment and some noise. The
statistics (:func:`lpq.latency.timing.sequential_compare`: interleaved rounds, median of the
per-round ratios, stopped once the answer is clear) are the real ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnxrt_testutil import decide, digits_builds

from lpq.latency import timing as core_timing
from lpq_onnxrt import model_io
from lpq_onnxrt.latency import timing

FW = "onnxrt"


class Load:
    """A shared machine: the load drifts (slowly, 1x to ``peak``x) and spikes (a run now
    and then takes 2-5x), and every run has ``noise`` (relative, log-normal)."""

    def __init__(self, seed: int, peak: float, noise: float = 0.1, spikes: float = 0.1) -> None:
        self.rng = np.random.default_rng(seed)
        self.peak, self.noise, self.spikes = peak, noise, spikes
        self.runs = 0
        self.phase = self.rng.uniform(0, 2 * math.pi)

    def factor(self) -> float:
        self.runs += 1
        drift = 1.0 + (self.peak - 1.0) * 0.5 * (1 + math.sin(self.phase + self.runs / 7.0))
        spike = self.rng.uniform(2, 5) if self.rng.random() < self.spikes else 1.0
        return drift * spike * float(np.exp(self.rng.normal(0, self.noise)))


def _int8_ops(model: onnx.ModelProto, names: list[str]) -> set[str]:
    """Ops of ``names`` that run int8 in ``model`` (QDQ: read a DequantizeLinear;
    QOperator: became a QLinear / integer kernel)."""
    from lpq_onnxrt.precision import INTEGER_KERNELS, owner_of

    producer = {out: node for node in model.graph.node for out in node.output}
    qoperator = any(node.op_type.startswith("QLinear") for node in model.graph.node)
    found = set()
    for node in model.graph.node:
        owner = owner_of(node.name, names)
        if owner is not None and node.op_type in INTEGER_KERNELS:
            found.add(owner)
        reads_dq = any(
            producer.get(i) is not None and producer[i].op_type == "DequantizeLinear"
            for i in node.input
        )
        if not qoperator and node.name in names and reads_dq:
            found.add(node.name)
    return found


class LoadedTimer:
    """The real interleaved statistics over scripted runs on a loaded machine."""

    takes_edges = True

    def __init__(self, costs: dict[str, tuple[float, float]], load: Load) -> None:
        self.costs, self.load = costs, load
        self.rounds: list[int] = []

    def seconds(self, model: onnx.ModelProto) -> float:
        int8 = _int8_ops(model, list(self.costs))
        return 1.0 + sum(c[1] if n in int8 else c[0] for n, c in self.costs.items())

    def __call__(
        self, models: dict[str, onnx.ModelProto], feed: Any, edges: Any = ()
    ) -> dict[str, float]:
        counted = {"runs": 0}

        def run(model: onnx.ModelProto) -> Callable[[], float]:
            base = self.seconds(model)

            def once() -> float:
                counted["runs"] += 1
                return base * self.load.factor()

            return once

        result = core_timing.sequential_compare(
            {label: run(model) for label, model in models.items()}, edges=edges, budget_s=200.0
        )
        self.rounds.append(counted["runs"] // len(models))
        return result


@pytest.fixture(scope="module")
def digits_parts() -> dict[str, Any]:
    return digits_builds()


def _plan(parts: dict[str, Any], timer: LoadedTimer) -> tuple[tuple[str, ...], str]:
    decided = decide(
        parts["build"],
        parts["prepared"].model,
        parts["ops"],
        {"input": np.zeros((1, 1, 8, 8), np.float32)},
        formats=("qdq", "qoperator"),
        timer=timer,
    )
    return tuple(sorted(decided.fp32_ops)), decided.quant_format


def _costs(parts: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Convs 2x faster in int8; the Gemm and MatMul 50% slower (fp32, int8 seconds); QDQ
    and QOperator alike (a tie the load must not decide)."""
    return {n: (1.0, 0.5) if t == "Conv" else (1.0, 1.5) for n, t in parts["ops"]}


class PercentileTimer(LoadedTimer):
    """The statistic used before: each model's own 20th percentile, a budget of measured
    (loaded) time, no pessimistic bound."""

    takes_edges = False

    def __call__(self, models: dict[str, onnx.ModelProto], feed: Any) -> dict[str, float]:  # type: ignore[override]
        base = {label: self.seconds(model) for label, model in models.items()}
        runs: dict[str, list[float]] = {label: [] for label in models}
        spent = 0.0
        while len(runs["current"]) < 7 or spent < 200.0 * len(models):
            for label in models:
                runs[label].append(base[label] * self.load.factor())
                spent += runs[label][-1]
        return {label: core_timing.quantile(values, 0.2) for label, values in runs.items()}


LOADS = [(seed, (1.5, 2.0, 3.0)[seed % 3]) for seed in range(10, 20)]


def test_the_same_plan_comes_out_idle_and_under_drifting_load(digits_parts):
    """Quantized on an idle machine and again ten times at load drifting up to 1.5x, 2x or
    3x, with spikes (a run in ten takes 2-5x): the same ops stay fp32, in the same format.
    The formats tie: the load of the moment must not pick one. The statistic used before
    (per-model 20th percentiles) gives other plans under the same loads."""
    costs = _costs(digits_parts)
    idle = _plan(digits_parts, LoadedTimer(costs, Load(seed=1, peak=1.0, noise=0.02)))
    fp32_ops, _ = idle
    assert fp32_ops == tuple(sorted(n for n, t in digits_parts["ops"] if t != "Conv"))
    plans = {
        _plan(digits_parts, LoadedTimer(costs, Load(s, peak, noise=0.05))) for s, peak in LOADS
    }
    assert plans == {idle}
    before = {
        _plan(digits_parts, PercentileTimer(costs, Load(s, peak, noise=0.05))) for s, peak in LOADS
    }
    assert len(before) > 1


def test_a_clear_comparison_stops_early_and_a_close_one_measures_longer():
    """A 2x difference is clear after the minimum rounds, even under drifting load; a
    ratio 1% from a threshold runs its whole budget."""

    def runs(ratio: float, load: Load) -> dict[str, Callable[[], float]]:
        return {"current": lambda: 1.0 * load.factor(), "candidate": lambda: ratio * load.factor()}

    counted: dict[str, int] = {}
    for label, ratio in (("clear", 0.5), ("close", 0.96)):
        load = Load(seed=5, peak=4.0, noise=0.1, spikes=0.0)
        seconds = core_timing.sequential_compare(runs(ratio, load), edges=(0.97,), budget_s=100.0)
        counted[label] = load.runs // 2
        assert seconds["candidate"] / seconds["current"] == pytest.approx(ratio, rel=0.1)
    assert counted["clear"] == core_timing.MIN_ROUNDS
    assert counted["close"] > 10 * counted["clear"]


def test_paired_ratios_hold_where_per_model_percentiles_do_not():
    """Load that rises during a comparison: each model's own 20th percentile (the old
    statistic) sees the early runs of one and the late runs of the other; the median of
    per-round ratios sees the true 0.9."""
    rng = np.random.default_rng(0)
    clock = {"run": 0}

    def run(seconds: float) -> Callable[[], float]:
        def once() -> float:
            clock["run"] += 1
            load = 1.0 + clock["run"] / 20.0  # the machine gets busier all the time
            return seconds * load * float(np.exp(rng.normal(0, 0.02)))

        return once

    result = core_timing.sequential_compare(
        {"current": run(1.0), "candidate": run(0.9)}, edges=(0.97,), budget_s=1e9, min_rounds=40
    )
    assert result["candidate"] / result["current"] == pytest.approx(0.9, rel=0.02)


def test_the_ort_timer_reuses_the_current_models_session(lpq_sample_model):
    """Comparing one current model with candidate after candidate makes one session for
    it, not one per comparison."""
    model = model_io.prepare(str(lpq_sample_model)).model
    timer = timing.OrtTimer({}, budget_s=0.01, min_runs=2)
    feed = {"input": np.zeros((1, 1, 8, 8), np.float32)}
    other = [model_io.copy_model(model) for _ in range(3)]
    for candidate in other:
        times = timer({"current": model, "candidate": candidate}, feed, (0.97,))
        assert set(times) == {"current", "candidate", core_timing.HIGH}
        assert min(times.values()) > 0
    assert timer.sessions_made == 1 + len(other)
