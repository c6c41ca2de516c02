"""lpq-onnxrt's side of the shared-scale rule (:mod:`lpq.ranges.shared_scale`): the
Concats of a static plan and their inputs' calibrated ranges.

The rule (which spread is too wide, what is said) is core's. Here: an activation input's
range is its minmax range from the calibration statistics (every algorithm's range lies
inside it, so a spread too wide under minmax is too wide under any); a constant input's
is its values' (ORT quantizes those with the output's scale too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lpq.ranges import Unshareable, max_spread, unshareable

if TYPE_CHECKING:
    import onnx

    from .calibration import CalibrationStats

Range = tuple[float, float]

#: ONNX op types whose inputs share the output's one scale.
MERGING_OPS = frozenset({"Concat"})


def unshareable_ops(
    model: onnx.ModelProto,
    stats: CalibrationStats,
    plan: Mapping[str, Any],
    options: Mapping[str, Any],
) -> list[Unshareable]:
    """The merging ops of ``plan`` (node names of ``model``) whose inputs' ranges are too
    far apart for one int8 scale (option ``concat_max_spread``, 0: none)."""
    limit = max_spread(options)
    if limit == 0:
        return []
    # 8-bit activations only: a 16-bit Concat keeps 4096 levels for a 16x narrower input.
    eight_bit = {
        name: cfg
        for name, cfg in plan.items()
        if getattr(getattr(cfg, "activation", None), "dtype", None) in ("int8", "uint8")
    }
    return unshareable(input_ranges(model, stats, eight_bit), limit)


def input_ranges(
    model: onnx.ModelProto, stats: CalibrationStats, names: Mapping[str, Any]
) -> dict[str, list[Range]]:
    """Per merging op of ``names``: the ranges of its inputs that have one (calibrated
    activations, constant initializers), in graph order."""
    from onnx import numpy_helper

    constants = {init.name: init for init in model.graph.initializer}
    calibrated = set(stats.tensor_names())
    found: dict[str, list[Range]] = {}
    for node in model.graph.node:
        if node.op_type not in MERGING_OPS or node.name not in names:
            continue
        ranges: list[Range] = []
        for tensor in node.input:
            if tensor in constants:
                values = numpy_helper.to_array(constants[tensor])
                if values.size and values.dtype.kind == "f":
                    ranges.append((min(float(values.min()), 0.0), max(float(values.max()), 0.0)))
            elif tensor in calibrated and stats.count(tensor):
                ranges.append(stats.compute_range(tensor, "minmax", symmetric=False))
        found[node.name] = ranges
    return found
