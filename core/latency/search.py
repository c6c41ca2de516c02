"""The latency search's public names, in one place (``lpq.latency.search``).

Which quantized ops to keep in float so that the model is never slower than fp32: the
one search every adaptor feeds. The work is split by job, and this module gathers the
names adaptors import (``lpq.latency`` re-exports them too):

- :mod:`lpq.latency.steps`: :func:`decide` and the search's steps, in order, with when
  each runs and the one rule every comparison is judged by (its docstring is the
  reference);
- :mod:`lpq.latency.rules`: :class:`Rules`, the numbers it decides by;
- :mod:`lpq.latency.backend`: what it asks a framework (:class:`Backend`) and the
  optional methods that turn on further steps (:class:`Variants`,
  :class:`Alternatives`, :class:`Blamer`, :class:`Comparer`, :class:`GainBound`);
- :mod:`lpq.latency.comparers`: the default timing of a comparison
  (:func:`runner_timer`, :func:`pooled`);
- :mod:`lpq.latency.decision`: its records, :class:`Decision` and :class:`Step`, and
  their JSON;
- :mod:`lpq.latency.adaptor`: the ``latency_aware`` option (:func:`enabled`) and the
  decision's log line and warning (:func:`announce`);
- :mod:`lpq.latency.timing`: the timing statistics (:class:`Comparison`,
  :func:`interleaved`), imported here as before the split.
"""

from __future__ import annotations

from .adaptor import announce, enabled
from .backend import Alternatives, Backend, Blamer, Comparer, GainBound, Variants
from .comparers import REMEASURE, Compare, Timer, pooled, runner_timer
from .decision import Decision, Step
from .rules import BLAME_ROUNDS, CLEAR_WIN, DEFAULT_MARGIN, Rules
from .steps import decide
from .timing import Comparison, Run, Timing, interleaved

__all__ = [
    "BLAME_ROUNDS",
    "CLEAR_WIN",
    "DEFAULT_MARGIN",
    "REMEASURE",
    "Alternatives",
    "Backend",
    "Blamer",
    "Compare",
    "Comparer",
    "Comparison",
    "Decision",
    "GainBound",
    "Rules",
    "Run",
    "Step",
    "Timer",
    "Timing",
    "Variants",
    "announce",
    "decide",
    "enabled",
    "interleaved",
    "pooled",
    "runner_timer",
]
