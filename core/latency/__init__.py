"""Latency-aware quantization, written once for every adaptor (``lpq.latency``).

The algorithm lives here; an adaptor supplies a small backend (:class:`Backend`: the plan's
ops, build a candidate with some ops in float, run a candidate once) and gets back a
:class:`Decision`: which ops stay float, with the measurements behind it.

- :mod:`lpq.latency.timing`: interleaved, robust timing: fixed rounds pooled near an edge
  (:func:`interleaved`) or stopped once clear of every edge (:func:`sequential_compare`);
- :mod:`lpq.latency.steps`: the decision (variants, alternatives, op types, blame rounds,
  fidelity, never slower than fp32), with :mod:`.rules` (the numbers it decides by),
  :mod:`.backend` (what it asks a framework, and the optional methods that turn on
  each step), :mod:`.comparers` (the default timing of a comparison), :mod:`.decision`
  (its records and their JSON) and :mod:`.adaptor` (the option, the log line);
  :mod:`lpq.latency.search` gathers their public names;
- :mod:`lpq.latency.cache`: decisions on disk per model, plan, shapes, machine, threads;
- :mod:`lpq.latency.table`: per-op float / quantized costs shared across models and runs.

docs/latency-aware.md describes the search and how to write a backend.
"""

from __future__ import annotations

from .search import (
    DEFAULT_MARGIN,
    Alternatives,
    Backend,
    Blamer,
    Comparer,
    Decision,
    GainBound,
    Rules,
    Step,
    Timer,
    Variants,
    announce,
    decide,
    enabled,
    pooled,
    runner_timer,
)
from .table import LatencyTable, Verdict
from .timing import Comparison, Timing, interleaved, sequential_compare

__all__ = [
    "DEFAULT_MARGIN",
    "Alternatives",
    "Backend",
    "Blamer",
    "Comparer",
    "Comparison",
    "Decision",
    "GainBound",
    "LatencyTable",
    "Rules",
    "Step",
    "Timer",
    "Timing",
    "Variants",
    "Verdict",
    "announce",
    "decide",
    "enabled",
    "interleaved",
    "pooled",
    "runner_timer",
    "sequential_compare",
]
