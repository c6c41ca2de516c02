"""Interleaved, robust timing of candidates on a busy machine: two statistics over
injectable run callables, with no framework in them.

:func:`interleaved` (core's default, through :func:`lpq.latency.pooled`): every round runs
each candidate once, in an order shuffled by a fixed seed, so a burst of load on a shared
machine (CI, two cores, another job) lands on all of them alike. Each candidate's time is
the median over rounds; how far two candidates are apart is read from the per-round
*paired* ratios (same round, same load), and the noise of that reading is the standard
error of their median, doubled (about a 95% interval). A comparison closer to a decision
threshold than its noise is measured again and pooled (see
:func:`lpq.latency.search.decide`). Tiny models (tens of microseconds) are called several
times per sample so that each sample lasts about :data:`SAMPLE_S`: timer resolution and
Python overhead then stay a small share of what is measured.

:func:`sequential_compare` (lpq-onnxrt's timer, :mod:`lpq_onnxrt.latency.timing`): a run
of each model in turn, every other round in reverse order, judged on the median of the
per-round ratios ``candidate / current`` and stopped as soon as that median is clearly on
one side of every decision threshold (``edges``): a 2x win needs a few rounds, a 2%
question its whole budget. On 2 shared cores most comparisons of PP-OCR cls and rec were
clear after :data:`MIN_ROUNDS`. Its bound is the ratio at :data:`BOUND_Z` standard errors
above the median. It lives here, beside :func:`interleaved`, because nothing in it is
ONNX Runtime's: the runs are callables returning seconds (tests script them with noise
and load drift), and any adaptor may time with it.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

#: One timing sample lasts about this long (short calls are repeated inside it).
SAMPLE_S = 0.002
#: The least noise a comparison is credited with: below it, timings still differ from
#: run to run (frequency scaling, cache state) more than their spread says.
NOISE_FLOOR = 0.01

#: Runs one inference of a candidate at the measuring input.
Run = Callable[[], object]


@dataclass(frozen=True)
class Comparison:
    """One timed comparison of a candidate with the current model, as every timer reports
    it to :func:`lpq.latency.search.decide`: the rule there is one line, a change is kept
    when ``high < 1 - need``.

    ``ratio`` is candidate / current (a paired statistic: the median of per-round ratios);
    ``high`` its pessimistic bound, the ratio plus what the timer's noise allows (about two
    standard errors of that median): :meth:`Timing.comparison` adds its noise to the
    ratio, lpq-onnxrt's sequential timer reads the ratio at two standard errors above."""

    current_ms: float
    candidate_ms: float
    ratio: float
    high: float
    rounds: int = 0

    @property
    def noise(self) -> float:
        """How far the bound lies above the ratio."""
        return max(0.0, self.high - self.ratio)


@dataclass
class Timing:
    """Per-round seconds of each candidate, timed interleaved (one list per label, one
    entry per round; all lists have the same length)."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return min((len(v) for v in self.samples.values()), default=0)

    def ms(self, label: str) -> float:
        """Median milliseconds per run of ``label``."""
        return statistics.median(self.samples[label]) * 1e3

    def ratio(self, label: str, base: str) -> float:
        """Median over rounds of time(label) / time(base) (paired: same round)."""
        return math.exp(statistics.median(self._log_ratios(label, base)))

    def noise(self, label: str, base: str) -> float:
        """Relative uncertainty of :meth:`ratio`: twice the standard error of the median
        of the paired log ratios (robust: from their median absolute deviation), at least
        :data:`NOISE_FLOOR`."""
        if self.rounds < 3:
            return 1.0
        _, standard_error = _log_ratio(self.samples[label], self.samples[base])
        return max(NOISE_FLOOR, math.expm1(2.0 * standard_error))

    def comparison(self, label: str, base: str) -> Comparison:
        """``label`` (the candidate) against ``base`` (the current model): the ratio and,
        as its bound, the ratio plus its :meth:`noise`."""
        ratio = self.ratio(label, base)
        return Comparison(
            current_ms=self.ms(base),
            candidate_ms=self.ms(label),
            ratio=ratio,
            high=ratio + self.noise(label, base),
            rounds=self.rounds,
        )

    def merged(self, other: Timing) -> Timing:
        """Both measurements pooled (labels of both)."""
        labels = set(self.samples) | set(other.samples)
        return Timing(
            {k: [*self.samples.get(k, []), *other.samples.get(k, [])] for k in sorted(labels)}
        )

    def _log_ratios(self, label: str, base: str) -> list[float]:
        pairs = zip(self.samples[label], self.samples[base])
        return [math.log(max(a, 1e-12) / max(b, 1e-12)) for a, b in pairs]


def interleaved(
    runs: Mapping[str, Run],
    *,
    min_rounds: int = 15,
    max_rounds: int = 200,
    budget_s: float = 0.6,
    warmup: int = 2,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time ``runs`` (label -> one inference) round-robin: at least ``min_rounds``
    rounds, then more until ``budget_s`` seconds have passed (at most ``max_rounds``).
    The order within each round is shuffled with ``seed``, so the same call times in the
    same order every time."""
    labels = sorted(runs)
    for _ in range(max(warmup, 1)):
        for label in labels:
            runs[label]()
    repeat = {label: _repeats(runs[label], clock) for label in labels}
    rng = random.Random(seed)
    timing = Timing({label: [] for label in labels})
    start = clock()
    while timing.rounds < max_rounds and (timing.rounds < min_rounds or clock() - start < budget_s):
        order = labels[:]
        rng.shuffle(order)
        for label in order:
            run, count = runs[label], repeat[label]
            began = clock()
            for _ in range(count):
                run()
            timing.samples[label].append((clock() - began) / count)
    return timing


def _repeats(run: Run, clock: Callable[[], float]) -> int:
    """How many calls make one sample of about :data:`SAMPLE_S`."""
    began = clock()
    run()
    once = max(clock() - began, 1e-7)
    return max(1, min(1000, round(SAMPLE_S / once)))


# -- the sequential statistic -------------------------------------------------------------

#: Rounds every :func:`sequential_compare` takes before it may stop.
MIN_ROUNDS = 6
#: At most this many rounds per :func:`sequential_compare`.
MAX_ROUNDS = 200
#: Seconds of idle-machine time per model a comparison may take (lpq-onnxrt's
#: ``latency_budget_s``). Only a close call uses it all (a clear one stops after
#: ``MIN_ROUNDS``), and a close call still unclear at the end keeps the plan as it is
#: (judged at the pessimistic bound). Was 1.0: on ddddocr's recognizer on 2 cores at load
#: 8, comparisons that ran to the budget were most of the 50 CPU s latency-aware
#: quantization cost; 0.3 s is 60 rounds of a 5 ms model.
DEFAULT_BUDGET_S = 0.3
#: A comparison stops when the median ratio is this many standard errors from every edge.
CLEAR_Z = 3.0
#: ... and at least this far (relative): nothing is decided closer than timing can resolve.
CLEAR_MIN = 0.01
#: The key of a paired comparison's pessimistic candidate seconds (see
#: :func:`sequential_compare`).
HIGH = "candidate_high"
#: ... that many standard errors above the median ratio.
BOUND_Z = 2.0


def sequential_compare(
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
        # not cut a comparison short, or it is decided on a few spiky rounds. Not longer
        # for a paired comparison still unclear at its budget: on PP-OCR cls at load 5-8
        # on 2 cores, 3x as long made most comparisons (near-ties) run 3x longer and
        # quantizing it cost 51 CPU s instead of 22 (with scripted load drifting up to 6x
        # run to run it raised identical plans from 9 to 19 of 20).
        spent = rounds * sum(min(values) for values in times.values())
        if spent >= budget_s * len(labels):
            break
    result = {label: quantile(values, 0.2) for label, values in times.items()}
    if paired:
        centre, error = _log_ratio(times["candidate"], times["current"])
        result["candidate"] = result["current"] * math.exp(centre)
        # How slow the candidate may be, given the noise: a change is kept only when it
        # wins at this bound, so a tie is not decided by the load of the moment.
        result[HIGH] = result["current"] * math.exp(centre + BOUND_Z * error)
    return result


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
    """The ``q`` quantile of ``values``: the sorted value at ``int(q * n)`` (no
    interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
