"""What every strategy sees, and the protocol by which it proposes trials.

A strategy *proposes*; the tuning engine *executes*. :meth:`Strategy.propose` is a
generator that yields batches of :class:`Candidate` and receives, for each batch, the
:class:`~lpq.TrialRecord` of every candidate in the same order. Candidates in one batch
are independent, so the engine may run them at the same time (``--workers``); the
strategy decides what to try next only from finished results, so serial and parallel
runs walk the same path. ``yield from one(cfg, stage)`` proposes a single trial.

Strategies never import a framework: they see only the tuning space and the
:class:`TuningContext`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..plan.tune_config import FLOAT_PRECISIONS, OpConfig, OpKey, TuneConfig
from ..plan.tuning_space import TuningSpace
from ..tuning.records import TrialRecord


class StopTuning(Exception):
    """Raised by the engine when the exit policy says stop (budget, timeout, first hit)."""


@dataclass(frozen=True)
class Candidate:
    """One proposed trial: a config and the stage name shown in reports."""

    cfg: TuneConfig
    stage: str = ""


#: What :meth:`Strategy.propose` is: yields batches, receives their records.
Proposals = Generator[list[Candidate], list[TrialRecord], None]


class TuningContext(ABC):
    """The strategy's window on a run. Implemented by the tuning driver (and fakes)."""

    space: TuningSpace
    rng: random.Random
    first_hit: bool
    higher_is_better: bool

    @abstractmethod
    def evaluate(self, cfg: TuneConfig, stage: str = "") -> TrialRecord:
        """Run (or replay) one trial now. For strategies written as :meth:`Strategy.
        traverse`; generator strategies yield candidates instead. Raises
        :class:`StopTuning` when tuning must stop."""

    @abstractmethod
    def meets_goal(self, record: TrialRecord) -> bool: ...

    def within_tolerance(self, record: TrialRecord) -> bool:
        """Whether ``record``'s accuracy alone is within the goal (it may still miss the
        goal by being slower than fp32 under the performance objective)."""
        return self.meets_goal(record)

    def shortfall(self, record: TrialRecord) -> float | None:
        """How far ``record``'s accuracy is from the goal, in metric units (<= 0: within
        it); ``None`` when unknown (a failed trial, or a context that cannot say)."""
        return None

    @abstractmethod
    def better(self, a: TrialRecord, b: TrialRecord | None) -> bool:
        """Whether ``a`` beats ``b`` on the objective (among goal-meeting trials)."""

    @abstractmethod
    def op_sensitivity(self, cfg: TuneConfig) -> dict[OpKey, float] | None:
        """Per-op quantization error of ``cfg`` versus fp32 from ``lpq_inspect_tensor``
        (no trial spent), or ``None`` if the adaptor cannot inspect tensors."""

    @property
    @abstractmethod
    def best(self) -> TrialRecord | None:
        """The best goal-meeting trial so far."""


class Strategy:
    """A way to walk the tuning space.

    Implement :meth:`propose` (a generator of candidate batches: parallel-ready), or, for
    a strictly sequential walk, :meth:`traverse` calling ``ctx.evaluate``.

    ``honours_first_hit``: whether the run stops at the first goal-meeting trial when the
    exit policy is ``first_hit``. Strategies whose first hit is a poor answer (e.g.
    ``conservative``, which starts from nearly fp32) complete their pass instead.
    """

    name = ""
    honours_first_hit = True
    #: The option names the strategy reads, or ``None`` to accept any (a strategy that
    #: checks its own in ``__init__``). A key outside the set is a :class:`ConfigError`
    #: naming the allowed ones: a typo in ``--strategy-option`` must not be ignored.
    option_names: frozenset[str] | None = None

    def __init__(self, **options: Any) -> None:
        allowed = type(self).option_names
        unknown = sorted(set(options) - allowed) if allowed is not None else []
        if unknown:
            raise ConfigError(
                f"strategy {self.name!r} has no option {', '.join(map(repr, unknown))}",
                hint=f"its options: {', '.join(sorted(allowed or ())) or 'none'}",
            )
        self.options = options

    def propose(self, ctx: TuningContext) -> Proposals:
        """Yield batches of candidates; each ``yield`` returns their records, in order."""
        raise NotImplementedError
        yield []  # pragma: no cover  (makes this a generator for type checkers)

    def traverse(self, ctx: TuningContext) -> None:
        """Sequential alternative to :meth:`propose`: call ``ctx.evaluate`` per trial."""
        raise NotImplementedError(f"strategy {self.name!r} implements neither propose nor traverse")

    @property
    def proposes(self) -> bool:
        """Whether this strategy implements :meth:`propose` (else :meth:`traverse`)."""
        return type(self).propose is not Strategy.propose


def one(
    cfg: TuneConfig, stage: str = ""
) -> Generator[list[Candidate], list[TrialRecord], TrialRecord]:
    """Propose a single trial: ``record = yield from one(cfg, "default")``."""
    records = yield [Candidate(cfg, stage)]
    return records[0]


def fall_back(space: TuningSpace, cfg: TuneConfig, keys: list[OpKey]) -> TuneConfig:
    """``cfg`` with ``keys`` in their fallback precision (fp32 unless the space says)."""
    return cfg.with_ops({key: space.fallback(key) for key in keys})


def requantize(
    space: TuningSpace, cfg: TuneConfig, keys: list[OpKey], reference: TuneConfig
) -> TuneConfig:
    """``cfg`` with ``keys`` set back to their choice in ``reference`` (or the default)."""
    changes: dict[OpKey, OpConfig] = {}
    for key in keys:
        choice = reference.ops.get(key)
        changes[key] = choice if choice is not None and choice.quantized else space.choices[key][0]
    return cfg.with_ops(changes)


def improves(ctx: TuningContext, record: TrialRecord, best: TrialRecord) -> bool:
    """Whether ``record`` is more accurate than ``best`` (failed trials never are)."""
    if record.status != "ok":
        return False
    if ctx.higher_is_better:
        return record.accuracy > best.accuracy
    return record.accuracy < best.accuracy


def accuracy_gain(ctx: TuningContext, record: TrialRecord, base: TrialRecord) -> float:
    """How much more accurate ``record`` is than ``base`` (negative: worse; -inf: failed)."""
    if record.status != "ok" or record.accuracy != record.accuracy:
        return float("-inf")
    gain = record.accuracy - base.accuracy
    return gain if ctx.higher_is_better else -gain


def runs_quantized(ctx: TuningContext, cfg: TuneConfig, record: TrialRecord) -> list[OpKey]:
    """The tunable ops ``cfg`` quantizes that its converted model really runs quantized.

    An op planned int8 may run in float (ORT has no int8 kernel for a lone Add between
    float ops; latency-aware quantization kept it fp32): falling it back changes nothing,
    so probing it wastes a trial. Read from the model when the adaptor reported it
    (``record.op_precisions``), else as planned."""
    keys = [key for key in ctx.space.tunable_ops if cfg.ops[key].quantized]
    ran = record.op_precisions
    if record.counts_from != "model" or not ran:
        return keys
    return [key for key in keys if ran.get(key[0]) not in FLOAT_PRECISIONS]


def ranked(ctx: TuningContext, cfg: TuneConfig, scores: dict[OpKey, float]) -> list[OpKey]:
    """The quantized tunable ops of ``cfg``, highest score (most harmful) first."""
    tunable = [key for key in ctx.space.tunable_ops if cfg.ops[key].quantized]
    return sorted(tunable, key=lambda key: -scores.get(key, 0.0))


def probe_op_by_op(
    ctx: TuningContext, cfg: TuneConfig, stage: str, keys: list[OpKey] | None = None
) -> Generator[list[Candidate], list[TrialRecord], dict[OpKey, float]]:
    """Fall back each op alone (one batch: parallel); an op's impact is the accuracy its
    fallback recovers on the model's output. ``keys``: the ops to probe (default: all
    quantized tunable ops)."""
    base = yield from one(cfg, stage)
    if keys is None:
        keys = [key for key in ctx.space.tunable_ops if cfg.ops[key].quantized]
    records = yield [Candidate(fall_back(ctx.space, cfg, [key]), stage) for key in keys]
    return {key: accuracy_gain(ctx, record, base) for key, record in zip(keys, records)}
