"""Latency-aware quantization: core's search (:func:`lpq.latency.decide`) over lpq-torch's
backend, which ops go back to fp32.

The search runs real quantization; the timing at each shape (``latency.time_at``) is
replaced by a cost model read from each candidate's converted graph (which ops really run
int8), so the outcome does not depend on this machine's load. The real timing path is
exercised by the benchmark (bench/bench_latency_aware.py --framework torch).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch import nn

import lpq
from lpq.latency import Decision, Timing


class ThreeLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.fixture(scope="module")
def run_state() -> Any:
    """One run state for the module (the model is exported once); each test has its own
    decision cache folder."""
    from lpq_torch import state

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = [torch.randn(8, 16, generator=gen) for _ in range(2)]
    with state.use(state.RunState()) as st:
        yield st, ThreeLinears().eval(), data


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch, run_state: Any, tmp_path: Any) -> Any:
    from lpq_torch import latency, precision

    _, model, data = run_state
    calls: list[int] = []  # the batch size of every timing

    def with_costs(int8_cost: dict[str, float], at_batch_1: dict[str, float] | None = None) -> None:
        """Each op costs 1.0 in fp32 and ``int8_cost`` in int8 (``at_batch_1`` when timed
        at batch 1), plus 1.0 for the rest of the model."""

        def cost(m: torch.nn.Module, costs: dict[str, float]) -> float:
            ops = precision.quantized_ops(m)
            return 1.0 + sum(costs[op] if ops.get(op) == "int8" else 1.0 for op in costs)

        def fake_time_at(backend: Any, candidates: Mapping[str, Any], args: Any) -> Timing:
            batch = latency.batch_size(args)
            calls.append(batch)
            costs = at_batch_1 if batch == 1 and at_batch_1 is not None else int8_cost
            return Timing({k: [cost(m, costs) / 1e3] * 15 for k, m in candidates.items()})

        monkeypatch.setattr(latency, "time_at", fake_time_at)

    def quantize() -> torch.nn.Module:
        pm = lpq.get_plugin_manager()
        cap = pm.query_capability("torch", model, data)
        ops = {k: cap.default_op_config(k) for k in cap.opwise}
        options = {"latency_aware": True, "latency_cache_dir": str(tmp_path)}
        return pm.quantize("torch", model, lpq.TuneConfig(ops, 16, options), data)

    def precisions(qmodel: torch.nn.Module) -> dict[str, str]:
        found: dict[str, str] = lpq.get_plugin_manager().quantized_ops("torch", qmodel)
        return found

    return with_costs, quantize, precisions, calls


def test_a_clearly_faster_plan_is_kept_as_planned(setup: Any) -> None:
    with_costs, quantize, precisions, calls = setup
    with_costs({"a": 0.3, "b": 0.3, "c": 0.3}, at_batch_1={"a": 1.3, "b": 1.3, "c": 1.3})
    qmodel = quantize()
    assert precisions(qmodel) == {"a": "int8", "b": "int8", "c": "int8"}
    assert calls == [8], "plan vs fp32 at the calibration batch only: a clear win there"
    decision = Decision.from_json(qmodel._lpq_latency)
    assert decision.keep_float == [] and len(decision.steps) == 1


def test_the_op_that_int8_makes_slower_goes_back_to_fp32(setup: Any) -> None:
    with_costs, quantize, precisions, calls = setup
    # the plan: 0.85x the fp32 time; b alone is slower in int8, its half [a, b] is not
    with_costs({"a": 0.3, "b": 1.6, "c": 0.5})
    qmodel = quantize()
    assert precisions(qmodel) == {"a": "int8", "b": "fp32", "c": "int8"}
    assert qmodel._lpq_latency["keep_float"] == ["b"]
    saved = lpq.TuneConfig.from_json(qmodel._lpq_tune_cfg)
    assert {name: cfg.quantized for (name, _), cfg in saved.ops.items()} == {
        "a": True,
        "b": False,
        "c": True,
    }
    assert saved.options["latency_aware"] is False
    searched = len(calls)
    assert precisions(quantize()) == {"a": "int8", "b": "fp32", "c": "int8"}
    assert len(calls) == searched, "the decision is kept for the same plan and shapes"


@pytest.mark.parametrize("costs", [{"a": 0.3, "b": 1.6, "c": 0.5}, {"a": 0.3, "b": 0.3, "c": 0.3}])
def test_the_resolved_config_is_the_decided_model(
    setup: Any, run_state: Any, costs: dict[str, float]
) -> None:
    """``lpq_resolved_config`` answers with the decided tune_cfg (latency_aware off, what
    it kept fp32 as fallbacks), whatever it kept: quantized again with it, the same ops
    run int8 and nothing is measured."""
    with_costs, quantize, precisions, calls = setup
    _, model, data = run_state
    with_costs(costs)
    qmodel = quantize()
    pm = lpq.get_plugin_manager()
    resolved = pm.resolved_config("torch", qmodel)
    assert resolved is not None and resolved.options["latency_aware"] is False
    searched = len(calls)
    again = pm.quantize("torch", model, resolved, data)
    assert len(calls) == searched, "nothing measured"
    assert precisions(again) == precisions(qmodel)
    x = data[0]
    assert torch.equal(again(x), qmodel(x))


def test_segments_move_a_neighbour_along_when_their_half_wins(setup: Any) -> None:
    """Core's segment rounds replace the old single-op step: [a, b] back in fp32 wins,
    so a goes with b (c, the other half, stays int8)."""
    with_costs, quantize, precisions, _ = setup
    with_costs({"a": 0.5, "b": 2.2, "c": 0.5})  # the plan: 1.05x the fp32 time
    assert precisions(quantize()) == {"a": "fp32", "b": "fp32", "c": "int8"}


def test_never_slower_than_fp32(setup: Any) -> None:
    with_costs, quantize, precisions, _ = setup
    with_costs({"a": 1.2, "b": 1.2, "c": 1.2})  # int8 slower everywhere
    with pytest.warns(lpq.LpqWarning, match="every op was kept in float"):
        qmodel = quantize()
    assert precisions(qmodel) == {"a": "fp32", "b": "fp32", "c": "fp32"}
    assert qmodel._lpq_latency["slower_than_float"] is True


def test_a_plan_measured_slower_within_the_noise_goes_back_to_fp32(setup: Any) -> None:
    with_costs, quantize, precisions, _ = setup
    with_costs({"a": 1.0067, "b": 1.0067, "c": 1.0067})  # 0.5% slower: within the noise
    with pytest.warns(lpq.LpqWarning):
        qmodel = quantize()
    assert precisions(qmodel) == {"a": "fp32", "b": "fp32", "c": "fp32"}


def test_the_worse_of_the_calibration_batch_and_batch_1_decides(setup: Any) -> None:
    with_costs, quantize, precisions, calls = setup
    # a little faster at batch 8 (not a clear win), slower at batch 1
    with_costs({"a": 0.9, "b": 0.9, "c": 0.9}, at_batch_1={"a": 1.3, "b": 1.3, "c": 1.3})
    with pytest.warns(lpq.LpqWarning):
        qmodel = quantize()
    assert precisions(qmodel) == {"a": "fp32", "b": "fp32", "c": "fp32"}
    assert set(calls) == {8, 1}


def test_the_model_digest_follows_the_weights(run_state: Any) -> None:
    from lpq_torch import latency

    _, model, _ = run_state
    twin = copy.deepcopy(model)
    assert latency.model_digest(twin) == latency.model_digest(model)
    with torch.no_grad():
        twin.a.weight[0, 0] += 1.0
    assert latency.model_digest(twin) != latency.model_digest(model)


def test_latency_aware_must_be_a_boolean(setup: Any) -> None:
    from lpq_torch import latency

    assert latency.wanted(lpq.TuneConfig({}, 16, {"latency_aware": "on"}))
    with pytest.raises(lpq.ConfigError):
        latency.wanted(lpq.TuneConfig({}, 16, {"latency_aware": "sometimes"}))
