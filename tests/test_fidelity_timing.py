"""The side-by-side timing of ``lpq quantize``'s fidelity gate, with a scripted adaptor:
fp32 and quantized alternate, round by round, and each round is one evaluate call (one
session) per model."""

from __future__ import annotations

from typing import Any

import numpy as np

import lpq
from lpq.eval import fidelity


class ScriptedAdaptor:
    """``pm.evaluate`` that records each call and 'runs' a model in its scripted time."""

    def __init__(self, ms: dict[str, float]) -> None:
        self.ms = ms
        self.calls: list[tuple[str, int]] = []

    def evaluate(self, framework: str, model: str, data: Any, metrics: Any, **kw: Any) -> None:
        batches = list(data)
        self.calls.append((model, len(batches)))
        measurer = kw["measurer"]
        for _ in batches:
            with measurer.measure():
                pass
            if measurer.samples:  # the scripted time for the batch just timed
                measurer.samples[-1] = self.ms[model] / 1e3


def test_timing_alternates_the_models_with_one_call_per_model_and_round():
    pm = ScriptedAdaptor({"fp32": 4.0, "int8": 2.0})
    data = lpq.ArrayLoader(np.zeros((8, 3), np.float32), batch_size=2)
    fp32_ms, int8_ms = fidelity._interleaved_ms(pm, "fw", "fp32", "int8", data)
    assert (fp32_ms, int8_ms) == (4.0, 2.0)
    assert [model for model, _ in pm.calls] == ["fp32", "int8"] * fidelity._TIMING_ROUNDS
    assert fidelity._TIMING_ROUNDS <= 3  # each call is a session (and a file load)
    # enough timed batches per model all the same (the first of each call is a warm-up)
    assert all(n == fidelity._TIMING_BATCHES for _, n in pm.calls)
    assert fidelity._TIMING_ROUNDS * (fidelity._TIMING_BATCHES - 1) >= 15
