"""What every strategy sees: the tuning space and a context that runs trials."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..tune_config import OpConfig, OpKey, TuneConfig
from ..tuning_space import TuningSpace

if TYPE_CHECKING:
    from ..trial import TrialRecord


class StopTuning(Exception):
    """Raised by :meth:`TuningContext.evaluate` when the exit policy says stop."""


class TuningContext(ABC):
    """The strategy's window on a run. Implemented by the tuner (and fakes in tests)."""

    space: TuningSpace
    rng: random.Random
    first_hit: bool
    higher_is_better: bool

    @abstractmethod
    def evaluate(self, cfg: TuneConfig, stage: str = "") -> TrialRecord:
        """Run (or replay) a trial; raises :class:`StopTuning` when tuning must stop."""

    @abstractmethod
    def meets_goal(self, record: TrialRecord) -> bool: ...

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


class Strategy(ABC):
    """A way to walk the tuning space. Subclasses implement :meth:`traverse`.

    ``honours_first_hit``: whether the run stops at the first goal-meeting trial when the
    exit policy is ``first_hit``. Strategies whose first hit is a poor answer (e.g.
    ``conservative``, which starts from nearly fp32) complete their pass instead.
    """

    name = ""
    honours_first_hit = True

    def __init__(self, **options: Any) -> None:
        self.options = options

    @abstractmethod
    def traverse(self, ctx: TuningContext) -> None:
        """Propose configs via ``ctx.evaluate`` until done; StopTuning ends it early."""


def fall_back(space: TuningSpace, cfg: TuneConfig, keys: list[OpKey]) -> TuneConfig:
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


def rank_by_sensitivity(
    ctx: TuningContext, cfg: TuneConfig, fallback_probe: Callable[[], dict[OpKey, float]]
) -> list[OpKey]:
    """Tunable ops, most harmful first: by inspected error, else by a trial-based probe."""
    errors = ctx.op_sensitivity(cfg)
    if errors is None:
        errors = fallback_probe()
    tunable = [key for key in ctx.space.tunable_ops if cfg.ops[key].quantized]
    return sorted(tunable, key=lambda key: -errors.get(key, 0.0))
