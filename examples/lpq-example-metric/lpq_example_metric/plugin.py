"""The lpq hooks of lpq-example-metric: it registers one metric, ``rel_l2``.

This module only registers; the metric lives in :mod:`lpq_example_metric.relative_l2`.
"""

from __future__ import annotations

from collections.abc import Callable

import lpq

from .relative_l2 import RelativeL2


@lpq.hookimpl
def lpq_register_metrics(register: Callable[[str, Callable[..., lpq.Metric]], None]) -> None:
    # `eval_metric="rel_l2"` and `lpq tune --metric rel_l2` call the factory with no
    # arguments; a user who wants other settings passes an instance: RelativeL2(output=1).
    register(RelativeL2.name, RelativeL2)
