"""Capability defaults that depend on the CPU: the first option must be correct here.

A capability YAML lists, per op type, the options the framework offers, the default first.
Some defaults are right on one CPU and wrong on another: ``reduce_range: [false, true]``
(full 8-bit weights first) is exact with VNNI/AMX, but on x86 without them u8 x s8 kernels
saturate in int16 and 7-bit weights are the correct default. This module reorders such
options for the CPU lpq plans for (:func:`lpq.hardware.cpu_features`, which
``LPQ_CPU_FLAGS`` can set), so every adaptor gets the same rule; the tuner may still try the
other option.
"""

from __future__ import annotations

import dataclasses

from ..hardware import CpuFeatures
from .capability import FrameworkCapability, QuantCapability, TensorOptions

#: Modes whose u8 x s8 integer kernels saturate without VNNI.
_INTEGER_KERNEL_MODES = frozenset({"static", "dynamic"})


def order_for_cpu(capability: FrameworkCapability, cpu: CpuFeatures) -> FrameworkCapability:
    """Put the options that are correct on ``cpu`` first (in place; returned for chaining).

    Today one rule: where u8 x s8 kernels saturate (:attr:`CpuFeatures.u8s8_saturates`),
    a weight's ``reduce_range`` defaults to ``true`` when the capability offers it;
    elsewhere to ``false``.
    """
    prefer = cpu.u8s8_saturates
    for key, caps in capability.opwise.items():
        capability.opwise[key] = [_ordered(cap, prefer) for cap in caps]
    for op_type, caps in capability.optypewise.items():
        capability.optypewise[op_type] = [_ordered(cap, prefer) for cap in caps]
    return capability


def _ordered(cap: QuantCapability, reduce_range_first: bool) -> QuantCapability:
    if cap.mode not in _INTEGER_KERNEL_MODES or cap.weight is None:
        return cap
    weight = _with_reduce_range_first(cap.weight, reduce_range_first)
    return cap if weight is cap.weight else dataclasses.replace(cap, weight=weight)


def _with_reduce_range_first(options: TensorOptions, first: bool) -> TensorOptions:
    values = tuple(options.extra.get("reduce_range", ()))
    if len(values) < 2 or bool(values[0]) == first:
        return options
    ordered = tuple(sorted(values, key=lambda value: bool(value) != first))
    return dataclasses.replace(options, extra={**options.extra, "reduce_range": ordered})
