"""Latency-aware quantization, written once for every adaptor (``lpq.latency``).

The algorithm lives here; an adaptor supplies a small backend (:class:`Backend`: the plan's
ops, build a candidate with some ops in float, run a candidate once) and gets back a
:class:`Decision`: which ops stay float, with the measurements behind it.

- :mod:`lpq.latency.timing`: interleaved, robust timing (round-robin, median, noise);
- :mod:`lpq.latency.search`: the decision (op types, blame rounds, never slower than fp32);
- :mod:`lpq.latency.cache`: decisions on disk per model, plan, shapes, machine, threads;
- :mod:`lpq.latency.table`: per-op float / quantized costs shared across models and runs.

docs/latency-aware.md describes the search and how to write a backend.
"""

from __future__ import annotations

from .search import (
    DEFAULT_MARGIN,
    Backend,
    Blamer,
    Decision,
    Step,
    Timer,
    announce,
    decide,
    enabled,
    runner_timer,
)
from .table import LatencyTable, Verdict
from .timing import Timing, interleaved

__all__ = [
    "DEFAULT_MARGIN",
    "Backend",
    "Blamer",
    "Decision",
    "LatencyTable",
    "Step",
    "Timer",
    "Timing",
    "Verdict",
    "announce",
    "decide",
    "enabled",
    "interleaved",
    "runner_timer",
]
