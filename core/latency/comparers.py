"""How a comparison is timed when the backend does not time it itself: the default
:data:`Timer` over the backend's runners (:func:`runner_timer`, fixed-budget
:func:`~lpq.latency.timing.interleaved` rounds), made a comparer by :func:`pooled`.

Kept apart from the steps: the search only ever sees a :data:`Compare` (current,
candidate, edges -> :class:`~lpq.latency.timing.Comparison`), whether it comes from here
or from a backend's own ``compare`` (lpq-onnxrt's sequential timer), so either can change
without touching the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .backend import Backend
from .timing import Comparison, Timing, interleaved

#: A comparison within its noise of the threshold is timed again, at most this often.
REMEASURE = 2

#: Times candidates (label -> candidate) interleaved.
Timer = Callable[[Mapping[str, Any]], Timing]
#: (current, candidate, edges) -> their comparison.
Compare = Callable[[Any, Any, Sequence[float]], Comparison]


def runner_timer(backend: Backend[Any], **timing_options: Any) -> Timer:
    """The default timer: :func:`lpq.latency.timing.interleaved` over the backend's
    runners (``timing_options``: its keyword arguments, e.g. ``budget_s``, ``seed``)."""

    def timer(candidates: Mapping[str, Any]) -> Timing:
        runs = {label: backend.runner(candidate) for label, candidate in candidates.items()}
        return interleaved(runs, **timing_options)

    return timer


def pooled(timer: Timer, remeasure: int = REMEASURE) -> Compare:
    """A :data:`Timer` as a comparer: a comparison that lands within its noise of the
    deciding edge (``edges[0]``) is timed again and pooled, at most ``remeasure`` times."""

    def compare(current: Any, candidate: Any, edges: Sequence[float]) -> Comparison:
        candidates = {"current": current, "candidate": candidate}
        timing = timer(candidates)
        for _ in range(remeasure):
            ratio = timing.ratio("candidate", "current")
            if abs(ratio - edges[0]) > timing.noise("candidate", "current"):
                break
            timing = timing.merged(timer(candidates))  # too close to call: pool more rounds
        return timing.comparison("candidate", "current")

    return compare
