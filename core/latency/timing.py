"""Interleaved, robust timing of several candidates on a busy machine.

Every round runs each candidate once, in an order shuffled by a fixed seed, so a burst of
load on a shared machine (CI, two cores, another job) lands on all of them alike. Each
candidate's time is the median over rounds; how far two candidates are apart is read
from the per-round *paired* ratios (same round, same load), and the noise of that reading
is the standard error of their median, doubled (about a 95% interval). A comparison
closer to a decision threshold than its noise is measured again and pooled (see
:func:`lpq.latency.search.decide`).

Tiny models (tens of microseconds) are called several times per sample so that each
sample lasts about :data:`SAMPLE_S`: timer resolution and Python overhead then stay a
small share of what is measured.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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
        logs = self._log_ratios(label, base)
        if len(logs) < 3:
            return 1.0
        center = statistics.median(logs)
        mad = statistics.median(abs(x - center) for x in logs)
        standard_error = 1.2533 * 1.4826 * mad / math.sqrt(len(logs))
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
