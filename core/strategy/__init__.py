"""Tuning strategies: framework-neutral walks over the tuning space.

Strategies never import a framework; they see only :class:`lpq.FrameworkCapability` and
talk to adaptors through the trial runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BUILTIN_STRATEGIES: dict[str, Callable[..., Any]] = {}
