"""The lpq hooks of lpq-example-strategy: it registers one strategy, ``bisect``.

This module only registers; the strategy lives in :mod:`lpq_example_strategy.bisection`.
Nothing here imports a framework (strategies never do).
"""

from __future__ import annotations

from collections.abc import Callable

import lpq

from .bisection import BisectStrategy


@lpq.hookimpl
def lpq_register_strategies(register: Callable[[str, Callable[..., lpq.Strategy]], None]) -> None:
    # The factory is called as factory(**TuningCriterion.strategy_options), once per run.
    register(BisectStrategy.name, BisectStrategy)
