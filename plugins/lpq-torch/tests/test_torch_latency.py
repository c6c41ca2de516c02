"""Latency-aware quantization: which ops go back to fp32, decided by measured speed.

The search runs real quantization; the timing is replaced by a cost model read from each
candidate's converted graph (which ops really run int8), so the outcome does not depend on
this machine's load. The real timing path is exercised by the VAD benchmark.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import lpq


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
    """One run state for the module (the model is exported once); decisions are cleared
    per test."""
    from lpq_torch import state

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = [torch.randn(8, 16, generator=gen) for _ in range(2)]
    with state.use(state.RunState()) as st:
        yield st, ThreeLinears().eval(), data


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch, run_state: Any) -> Any:
    from lpq_torch import latency, precision

    st, model, data = run_state
    st.latency.clear()
    calls: list[int] = []

    def with_costs(int8_cost: dict[str, float]) -> None:
        def cost(m: torch.nn.Module) -> float:
            ops = precision.quantized_ops(m)
            return 1.0 + sum(int8_cost[op] if p == "int8" else 1.0 for op, p in ops.items())

        def fake_ratio(a: torch.nn.Module, b: torch.nn.Module, args: Any) -> float:
            calls.append(1)
            return cost(a) / cost(b)

        monkeypatch.setattr(latency, "paired_ratio", fake_ratio)

    def quantize() -> dict[str, str]:
        pm = lpq.get_plugin_manager()
        cap = pm.query_capability("torch", model, data)
        ops = {k: cap.default_op_config(k) for k in cap.opwise}
        cfg = lpq.TuneConfig(ops, 16, {"latency_aware": True})
        return pm.quantized_ops("torch", pm.quantize("torch", model, cfg, data))

    return with_costs, quantize, calls


def test_a_clearly_faster_plan_is_kept_as_planned(setup: Any) -> None:
    with_costs, quantize, calls = setup
    with_costs({"a": 0.3, "b": 0.3, "c": 0.3})
    assert quantize() == {"a": "int8", "b": "int8", "c": "int8"}
    assert len(calls) == 1  # plan vs fp32 only


def test_the_op_that_int8_makes_slower_goes_back_to_fp32(setup: Any) -> None:
    with_costs, quantize, calls = setup
    with_costs({"a": 0.5, "b": 2.2, "c": 0.5})  # the plan: 1.05x the fp32 time
    assert quantize() == {"a": "int8", "b": "fp32", "c": "int8"}
    searched = len(calls)
    assert quantize() == {"a": "int8", "b": "fp32", "c": "int8"}
    assert len(calls) == searched, "the decision is kept for the same plan and shapes"


def test_never_slower_than_fp32(setup: Any) -> None:
    with_costs, quantize, _ = setup
    with_costs({"a": 1.2, "b": 1.2, "c": 1.2})  # int8 slower everywhere
    assert quantize() == {"a": "fp32", "b": "fp32", "c": "fp32"}


def test_latency_aware_must_be_a_boolean(setup: Any) -> None:
    from lpq_torch import latency

    with pytest.raises(lpq.ConfigError):
        latency.wanted(lpq.TuneConfig({}, 16, {"latency_aware": "yes"}))
