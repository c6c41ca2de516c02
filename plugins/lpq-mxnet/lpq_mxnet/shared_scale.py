"""lpq-mxnet's side of the shared-scale rule (:mod:`lpq.ranges.shared_scale`): the int8
Concats of a plan and their inputs' ranges on the calibration samples.

MXNet's quantized Concat requantizes every input to one range, the widest of them. A
head that concatenates pixel boxes and sigmoid scores then reads every score as 0 or one
step of the boxes' range: on a [0, 320] / [0, 1] head, scores off by 0.61. The rule is
core's. Here the ranges come from running the fp32 graph's inputs to those Concats over
the calibration samples, before anything is quantized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lpq.ranges import Unshareable, max_spread, unshareable

from . import data
from .framework import mxnet
from .model_io import Graph, ModelInfo

#: MXNet op types whose inputs share the output's one range.
MERGING_OPS = frozenset({"Concat"})
#: Calibration samples run at once while the ranges are read.
BATCH = 16

Range = tuple[float, float]


def unshareable_ops(
    graph: Graph,
    chosen: Mapping[str, Any],
    arrays: Sequence[np.ndarray],
    options: Mapping[str, Any],
) -> list[Unshareable]:
    """The merging ops of ``chosen`` whose inputs' ranges are too far apart for one int8
    range (option ``concat_max_spread``, 0: none)."""
    limit = max_spread(options)
    if limit == 0:
        return []
    nodes = graph.json()["nodes"]
    merging = [n for n in nodes if n["op"] in MERGING_OPS and n["name"] in chosen]
    if not merging:
        return []
    tensors = {
        name: [_tensor_name(nodes, entry) for entry in node["inputs"]]
        for node in merging
        for name in [node["name"]]
    }
    ranges = _ranges(graph, {t for names in tensors.values() for t in names}, arrays)
    return unshareable(
        {op: [ranges[t] for t in names if t in ranges] for op, names in tensors.items()}, limit
    )


def _tensor_name(nodes: list[dict[str, Any]], entry: list[int]) -> str:
    """The name ``symbol.get_internals()`` gives a node input (``[node, output, version]``):
    a variable's own name, else ``NODE_output`` (``NODE_outputK`` of several outputs)."""
    node = nodes[entry[0]]
    if node["op"] == "null":
        return str(node["name"])
    outputs = int(node.get("attrs", {}).get("num_outputs", 1))
    return f"{node['name']}_output" + (str(entry[1]) if outputs > 1 else "")


def _ranges(graph: Graph, tensors: set[str], arrays: Sequence[np.ndarray]) -> dict[str, Range]:
    """Each float tensor's (min, max) with 0 inside: parameters from their values, graph
    inputs from ``arrays``, the others by running the fp32 graph up to them."""
    found: dict[str, Range] = {}
    computed = []
    for tensor in tensors:
        value = graph.params.get(f"arg:{tensor}", graph.params.get(f"aux:{tensor}"))
        if value is not None:
            found[tensor] = _range(value.asnumpy())
        elif tensor in graph.input_names:
            found[tensor] = _range(arrays[graph.input_names.index(tensor)])
        else:
            computed.append(tensor)
    if not computed:
        return found
    mx = mxnet()
    internals = graph.symbol.get_internals()
    outputs = [name for name in computed if name in internals.list_outputs()]
    taps = Graph(
        mx.sym.Group([internals[name] for name in outputs]), graph.params, graph.input_names
    )
    info = ModelInfo(taps.symbol, list(graph.input_names), "fp32", [])
    block = taps.block(info=info, hybridize=False)
    low, high = dict.fromkeys(outputs, 0.0), dict.fromkeys(outputs, 0.0)
    for start in range(0, len(arrays[0]), BATCH):
        values = data.run(block, [data.to_nd(a[start : start + BATCH]) for a in arrays])
        for name, value in zip(outputs, values if isinstance(values, list | tuple) else [values]):
            array = value.asnumpy()
            if array.size:
                low[name] = min(low[name], float(array.min()))
                high[name] = max(high[name], float(array.max()))
    found.update({name: (low[name], high[name]) for name in outputs})
    return found


def _range(values: np.ndarray) -> Range:
    if not values.size or values.dtype.kind != "f":
        return (0.0, 0.0)
    return (min(float(values.min()), 0.0), max(float(values.max()), 0.0))
