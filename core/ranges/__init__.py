"""Activation-range decisions, written once for every adaptor (``lpq.ranges``).

- :mod:`lpq.ranges.choice`: the ``auto`` range algorithm (each candidate built and
  measured, the smallest output error picked) and the per-tensor narrowing of small
  plans, through a small per-adaptor :class:`RangeBackend` (build a plan, measure a
  model's output error).
- :mod:`lpq.ranges.shared_scale`: ops (Concat) whose inputs' calibrated ranges are too
  far apart for the one int8 scale of their output, kept fp32.

Numpy-free and framework-free: the adaptor's backend does the building and running.
docs/onnxrt.md ("Range choice") describes the rule and lpq-onnxrt's backend.
"""

from __future__ import annotations

from .choice import (
    AUTO,
    CANDIDATES,
    MIN_GAIN,
    NARROW_FACTORS,
    NARROW_GAIN,
    NARROW_MAX_OPS,
    NARROW_MAX_VALUES,
    PARTS,
    SCALES_OPTION,
    RangeBackend,
    RangeChoice,
    auto_ops,
    narrow,
    narrowing_pays,
    pick,
    record,
    resolve,
    resolved,
    scales_from,
    with_algorithm,
)
from .shared_scale import (
    MAX_SPREAD,
    SPREAD_OPTION,
    KeptFloat,
    Unshareable,
    keep_float,
    max_spread,
    spread,
    unshareable,
)

__all__ = [
    "AUTO",
    "CANDIDATES",
    "MAX_SPREAD",
    "MIN_GAIN",
    "NARROW_FACTORS",
    "NARROW_GAIN",
    "NARROW_MAX_OPS",
    "NARROW_MAX_VALUES",
    "PARTS",
    "SCALES_OPTION",
    "SPREAD_OPTION",
    "KeptFloat",
    "RangeBackend",
    "RangeChoice",
    "Unshareable",
    "auto_ops",
    "keep_float",
    "max_spread",
    "narrow",
    "narrowing_pays",
    "pick",
    "record",
    "resolve",
    "resolved",
    "scales_from",
    "spread",
    "unshareable",
    "with_algorithm",
]
