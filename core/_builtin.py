"""lpq's own plugin: the built-in metrics and strategies, registered like anyone else's."""

from __future__ import annotations

from .hookspecs import hookimpl
from .plugin_types import RegisterMetric, RegisterStrategy


@hookimpl
def lpq_register_metrics(register: RegisterMetric) -> None:
    from .metrics import BUILTIN_METRICS

    for name, factory in BUILTIN_METRICS.items():
        register(name, factory)


@hookimpl
def lpq_register_strategies(register: RegisterStrategy) -> None:
    from .strategy import BUILTIN_STRATEGIES

    for name, factory in BUILTIN_STRATEGIES.items():
        register(name, factory)
