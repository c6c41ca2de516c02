"""Tuning strategies: framework-neutral walks over the tuning space.

Strategies never import a framework; they see only the :class:`~lpq.tuning_space.TuningSpace`
and a :class:`TuningContext` that runs trials through the adaptor. Third parties register
their own through the ``lpq_register_strategies`` hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import StopTuning, Strategy, TuningContext
from .strategies import (
    AutoStrategy,
    BasicStrategy,
    ConservativeStrategy,
    ExhaustiveStrategy,
    MSEStrategy,
    RandomStrategy,
)

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

__all__ = ["BUILTIN_STRATEGIES", "StopTuning", "Strategy", "TuningContext"]
