"""lpq-tf's side of the shared-scale rule (:mod:`lpq.ranges.shared_scale`): the
CONCATENATION ops of a static int8 plan and their inputs' ranges on the calibration
samples.

TFLite's int8 CONCATENATION gives its inputs and output one scale and zero point (the
converter requantizes the inputs to the output's). A Keras head that concatenates pixel
boxes and sigmoid scores then reads every score as 0 or one step of the boxes' range: on
a [0, 320] / [0, 1] head, scores off by 0.63. The rule is core's; here the ranges come
from running the float ``.tflite`` over the calibration samples with every intermediate
tensor kept (the converter's own calibration sees the same values).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import OpConfig
from lpq.ranges import Unshareable, max_spread, unshareable

from .runtime import Runner

if TYPE_CHECKING:
    from .calibration import Samples
    from .model_io import Prepared

#: TFLite op types whose inputs share the output's one scale.
MERGING_OPS = frozenset({"CONCATENATION"})


def unshareable_ops(
    prepared: Prepared,
    configs: Mapping[str, OpConfig],
    samples: Samples | None,
    options: Mapping[str, Any],
) -> list[Unshareable]:
    """The static int8 merging ops of ``configs`` whose inputs' ranges are too far apart
    for one int8 scale (option ``concat_max_spread``, 0: none)."""
    limit = max_spread(options)
    if limit == 0 or samples is None or not len(samples):
        return []
    merging = {
        op.index: op
        for op in prepared.graph.model_ops()
        if op.op_type in MERGING_OPS and _static_int8(configs.get(prepared.names[op.index]))
    }
    if not merging:
        return []
    # Every CONCATENATION's inputs, read once per model and samples (one run of the float
    # model over them; a tuning run's trials ask again with other ops int8).
    key = ("concat-input-ranges", samples.digest, len(samples))
    if key not in prepared.cache:
        every = {
            t for op in prepared.graph.model_ops() if op.op_type in MERGING_OPS for t in op.inputs
        }
        prepared.cache[key] = _tensor_ranges(prepared, every, samples)
    ranges: dict[int, tuple[float, float]] = prepared.cache[key]
    inputs = {
        prepared.names[index]: [ranges[t] for t in op.inputs if t in ranges]
        for index, op in merging.items()
    }
    return unshareable(inputs, limit)


def _static_int8(cfg: OpConfig | None) -> bool:
    if cfg is None or not cfg.quantized or cfg.mode != "static":
        return False
    return cfg.activation is None or cfg.activation.dtype == "int8"


def _tensor_ranges(
    prepared: Prepared, tensors: set[int], samples: Samples
) -> dict[int, tuple[float, float]]:
    """Each float tensor's (min, max) over the samples, with 0 inside (as quantized);
    constants from their data."""
    graph = prepared.graph
    found: dict[int, tuple[float, float]] = {}
    activations = []
    for index in tensors:
        if index < 0 or graph.tensors[index].dtype is not np.float32:
            continue
        data = graph.constant(index)
        if data is None:
            activations.append(index)
        elif data.size:
            found[index] = (min(float(data.min()), 0.0), max(float(data.max()), 0.0))
    if not activations:
        return found
    runner = Runner(prepared.float_tflite, preserve=True)
    low = dict.fromkeys(activations, 0.0)
    high = dict.fromkeys(activations, 0.0)
    for sample in samples.as_lists():
        runner.run(sample)
        for index in activations:
            values = runner.interpreter.get_tensor(index)
            if values.size:
                low[index] = min(low[index], float(values.min()))
                high[index] = max(high[index], float(values.max()))
    found.update({index: (low[index], high[index]) for index in activations})
    return found
