"""The side-by-side timing of ``lpq quantize``'s fidelity gate, with a scripted adaptor:
fp32 and quantized alternate, round by round, and each round is one evaluate call (one
session) per model."""

from __future__ import annotations

from typing import Any

import numpy as np

import lpq
from lpq.eval import fidelity
from lpq.eval.data import split_batch


class ScriptedAdaptor:
    """``pm.evaluate`` that records each call and 'runs' a model in its scripted time."""

    def __init__(self, ms: dict[str, float], fixed: int | None = None) -> None:
        self.ms, self.fixed = ms, fixed
        self.calls: list[tuple[str, int]] = []
        self.samples: list[int] = []  # samples in each call's batch

    def evaluate(self, framework: str, model: str, data: Any, metrics: Any, **kw: Any) -> None:
        batches = list(data)
        self.calls.append((model, len(batches)))
        samples = len(split_batch(batches[0])[0])
        self.samples.append(samples)
        if self.fixed is not None and samples != self.fixed:
            raise lpq.DataError(f"the model takes a fixed batch of {self.fixed}")
        measurer = kw["measurer"]
        for _ in batches:
            with measurer.measure():
                pass
            if measurer.samples:  # the scripted time for the batch just timed
                measurer.samples[-1] = self.ms[model] / 1e3


def test_timing_alternates_the_models_with_one_call_per_model_and_round():
    pm = ScriptedAdaptor({"fp32": 4.0, "int8": 2.0})
    data = lpq.ArrayLoader(np.zeros((8, 3), np.float32), batch_size=2)
    batch, (fp32_ms, int8_ms) = fidelity._timed(pm, "fw", "fp32", "int8", data, None)
    assert (batch, fp32_ms, int8_ms) == (2, 4.0, 2.0)
    assert [model for model, _ in pm.calls] == ["fp32", "int8"] * fidelity._TIMING_ROUNDS
    assert fidelity._TIMING_ROUNDS <= 3  # each call is a session (and a file load)
    # enough timed batches per model all the same (the first of each call is a warm-up)
    assert all(n == fidelity._TIMING_BATCHES for _, n in pm.calls)
    assert fidelity._TIMING_ROUNDS * (fidelity._TIMING_BATCHES - 1) >= 15


def test_timing_is_on_the_batch_the_decisions_were_made_at():
    """One sample of the first held-out batch by default (latency-aware decisions are
    timed on one), ``latency_batch_size`` samples when asked; the whole batch where the
    model refuses fewer (a fixed batch), or where it holds fewer."""
    data = lpq.ArrayLoader(np.zeros((13, 3), np.float32), batch_size=32)
    pm = ScriptedAdaptor({"fp32": 4.0, "int8": 2.0})
    assert fidelity._timed(pm, "fw", "fp32", "int8", data, 1)[0] == 1
    assert set(pm.samples) == {1}
    assert fidelity._timed(ScriptedAdaptor(pm.ms), "fw", "fp32", "int8", data, 8)[0] == 8
    assert fidelity._timed(ScriptedAdaptor(pm.ms), "fw", "fp32", "int8", data, 64)[0] == 13
    labelled = lpq.ArrayLoader(np.zeros((13, 3), np.float32), np.zeros(13), batch_size=32)
    counted = ScriptedAdaptor(pm.ms)
    assert fidelity._timed(counted, "fw", "fp32", "int8", labelled, 1)[0] == 1
    assert set(counted.samples) == {1}
    fixed = ScriptedAdaptor(pm.ms, fixed=13)
    batch, times = fidelity._timed(fixed, "fw", "fp32", "int8", data, 1)
    assert (batch, times) == (13, (4.0, 2.0)) and fixed.samples[-1] == 13
