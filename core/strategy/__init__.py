"""Tuning strategies: framework-neutral walks over the tuning space.

Strategies never import a framework; they see only the :class:`~lpq.plan.tuning_space.
TuningSpace` and a :class:`TuningContext`. Each built-in strategy is one module here;
third parties register their own through the ``lpq_register_strategies`` hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .auto import AutoStrategy
from .base import (
    Candidate,
    Proposals,
    StopTuning,
    Strategy,
    TuningContext,
    accuracy_gain,
    fall_back,
    improves,
    one,
    probe_op_by_op,
    ranked,
    requantize,
    runs_quantized,
)
from .basic import BasicStrategy
from .conservative import ConservativeStrategy
from .exhaustive import ExhaustiveStrategy
from .mse import MSEStrategy
from .random_search import RandomStrategy

BUILTIN_STRATEGIES: dict[str, Callable[..., Any]] = {
    cls.name: cls
    for cls in (
        AutoStrategy,
        BasicStrategy,
        ConservativeStrategy,
        MSEStrategy,
        ExhaustiveStrategy,
        RandomStrategy,
    )
}

__all__ = [
    "BUILTIN_STRATEGIES",
    "Candidate",
    "Proposals",
    "StopTuning",
    "Strategy",
    "TuningContext",
    "accuracy_gain",
    "fall_back",
    "improves",
    "one",
    "probe_op_by_op",
    "ranked",
    "requantize",
    "runs_quantized",
]
