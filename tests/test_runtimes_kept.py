"""Runtimes kept for a scope (``lpq.runtimes_kept`` / ``lpq.kept_runtime``): made once per
key inside a scope, every time outside one, dropped when the scope ends; the fidelity
gate's timing rounds run inside one."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np

import lpq
from lpq.eval import fidelity


class Runtime:
    """Stands for a session (weak-referenceable)."""


def test_a_runtime_is_made_once_per_key_in_a_scope_and_dropped_after():
    made: list[str] = []

    def make(name: str) -> Runtime:
        made.append(name)
        return Runtime()

    model = object()
    with lpq.runtimes_kept():
        first = lpq.kept_runtime(("a", id(model)), lambda: make("a"), holds=model)
        again = lpq.kept_runtime(("a", id(model)), lambda: make("a"), holds=model)
        other = lpq.kept_runtime(("b", id(model)), lambda: make("b"), holds=model)
        with lpq.runtimes_kept():  # nested: the outer scope's
            inner = lpq.kept_runtime(("a", id(model)), lambda: make("a"), holds=model)
        assert first is again is inner and other is not first
        # another object under the same key (an id taken by someone else) gets its own
        stranger = lpq.kept_runtime(("a", id(model)), lambda: make("stranger"), holds=object())
        assert stranger is not first
    assert made == ["a", "b", "stranger"]
    gone = weakref.ref(first)
    del first, again, inner, other, stranger
    gc.collect()
    assert gone() is None  # the scope held it, nothing after
    outside = [lpq.kept_runtime("a", lambda: make("out")) for _ in range(2)]
    assert outside[0] is not outside[1] and made[-2:] == ["out", "out"]


class KeepingAdaptor:
    """``pm.evaluate`` that makes its 'session' through ``lpq.kept_runtime`` and times
    the batches it gets."""

    def __init__(self) -> None:
        self.sessions: list[str] = []

    def evaluate(self, framework: str, model: str, data: Any, metrics: Any, **kw: Any) -> None:
        lpq.kept_runtime(("scripted", model), lambda: self.sessions.append(model))
        measurer = kw["measurer"]
        for _ in data:
            with measurer.measure():
                pass


def test_the_gates_timing_rounds_share_each_models_runtime():
    pm = KeepingAdaptor()
    data = lpq.ArrayLoader(np.zeros((4, 3), np.float32), batch_size=2)
    fidelity._timed(pm, "fw", "fp32", "int8", data, None)
    assert fidelity._TIMING_ROUNDS > 1
    assert pm.sessions == ["fp32", "int8"]  # one each, not one per round
    fidelity._timed(pm, "fw", "fp32", "int8", data, None)
    assert pm.sessions == ["fp32", "int8"] * 2  # a new check makes its own
