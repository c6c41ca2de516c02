"""Timing whole models: interleaved runs, compared by a low percentile.

Every comparison times whole models, interleaved (a run of each, in turn, many times),
so drift on a shared machine hits both sides alike.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import lpq

if TYPE_CHECKING:
    import onnx

    from .decision import Timer


def measuring_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Session options for measurements: the user's, with one intra-op thread unless the
    user chose a thread count (on a shared machine, timings with every core are noise;
    which kernel wins rarely depends on the thread count)."""
    chosen = dict(options)
    if chosen.get("intra_op_num_threads") is None and chosen.get("threads") is None:
        chosen["intra_op_num_threads"] = 1
    return chosen


def ort_timer(options: Mapping[str, Any], budget_s: float = 1.0, min_runs: int = 7) -> Timer:
    """Time ONNX Runtime sessions (with :func:`measuring_options`), interleaved."""
    options = measuring_options(options)

    def measure(
        models: Mapping[str, onnx.ModelProto], feed: Mapping[str, np.ndarray]
    ) -> dict[str, float]:
        from ..session import create_session

        # With parallel tuning workers: the machine to ourselves, every core (sessions
        # are made inside, so their thread pools get every core too).
        with lpq.exclusive_timing():
            sessions = {label: create_session(proto, options) for label, proto in models.items()}
            feeds = dict(feed)
            for session in sessions.values():  # warm-up: first runs allocate, pack weights
                session.run(None, feeds)
                session.run(None, feeds)
            times: dict[str, list[float]] = {label: [] for label in sessions}
            deadline = time.perf_counter() + budget_s * len(sessions)
            runs = 0
            while runs < min_runs or (time.perf_counter() < deadline and runs < 200):
                for label, session in sessions.items():
                    start = time.perf_counter()
                    session.run(None, feeds)
                    times[label].append(time.perf_counter() - start)
                runs += 1
        # The 20th percentile, not the median: on a shared machine other jobs only ever add
        # time, and at load 8 on 2 cores medians of one model moved 2x between comparisons.
        return {label: _quantile(values, 0.2) for label, values in times.items()}

    return measure


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
