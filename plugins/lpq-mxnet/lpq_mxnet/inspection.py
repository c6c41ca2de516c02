"""lpq_inspect_tensor: what a model computes, per fp32 op (what it runs in which precision
is :mod:`lpq_mxnet.precision`).

An op's activation is the output of its oneDNN fusion group (a Convolution's is taken
after the BatchNorm / ReLU / residual add fused with it), in the fp32 and the quantized
model alike, because a fused int8 kernel has no other output; fp32 and int8 captures of
the same op therefore compare directly. int8 outputs are dequantized with their
calibrated range by MXNet's own ``dequantize``.

Weights: the fp32 model's are captured as they are. A quantized model stores int8
weights only for per-tensor FullyConnected (``*_weight_quantize`` with its range), which
are captured dequantized; oneDNN quantizes Convolution and per-channel FullyConnected
weights inside the kernel (after folding BatchNorm), so those are not in the model to
read and are not reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lpq import Inspection, ModelError, split_batch

from . import data
from .framework import mxnet
from .graph import Group, group_of, groups
from .model_io import Graph, ModelInfo, to_graph


@dataclass(frozen=True)
class Tap:
    """Where an op's activation is read: a tensor, plus its range if it is int8."""

    tensor: str
    min_tensor: str | None = None
    max_tensor: str | None = None


def inspect_tensor(
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: Literal["activation", "weight", "both"],
    iteration: int | None,
) -> Inspection:
    first, items = data.peek(dataloader, "inspection")
    graph = to_graph(model, first)
    names = list(op_names) if op_names is not None else [n for n, _ in graph.tunable_ops()]
    result = Inspection()
    if kind in ("weight", "both"):
        result.weights = _weights(graph, names)
    if kind in ("activation", "both"):
        result.activations = _activations(graph, names, items, iteration)
    return result


def _taps(graph: Graph, names: Sequence[str]) -> dict[str, Tap]:
    outputs = set(graph.symbol.get_internals().list_outputs())
    int8 = graph.info is not None and graph.info.precision == "int8"
    found = groups(graph.json() if int8 else graph.fused_json())
    taps = {}
    for name in names:
        group = group_of(found, name)
        if group is None:
            raise ModelError(
                f"the model has no op named {name}",
                hint="take op names from the adaptor's capability (lpq capability)",
            )
        taps[name] = _quantized_tap(group, outputs) if int8 else _fp32_tap(group, outputs)
    return taps


def _fp32_tap(group: Group, outputs: set[str]) -> Tap:
    """The fused group's output, read in the unfused fp32 graph: its head op's output
    (``HEAD_output``, or ``HEAD_output0`` for an op with several outputs)."""
    for tensor in (f"{group.head}_output", f"{group.head}_output0"):
        if tensor in outputs:
            return Tap(tensor)
    raise ModelError(
        f"cannot find the output of {group.head} in the graph",
        hint="inspect another op (this one's output is not a named tensor)",
    )


def _quantized_tap(group: Group, outputs: set[str]) -> Tap:
    node = group.node
    float_output = group.attrs.get("enable_float_output", "").lower() == "true"
    if group.quantized and not float_output:
        for suffixes in (("_output", "_output_min", "_output_max"),
                         ("_output", "_min_output", "_max_output")):  # fmt: skip
            names = [node + s for s in suffixes]
            if all(n in outputs for n in names):
                return Tap(*names)
    return Tap(f"{node}_output")


def _activations(
    graph: Graph, names: Sequence[str], items: Iterable[Any], iteration: int | None
) -> dict[str, list[np.ndarray]]:
    mx = mxnet()
    taps = _taps(graph, names)
    internals = graph.symbol.get_internals()
    wanted: list[str] = []
    for tap in taps.values():
        wanted.extend(t for t in (tap.tensor, tap.min_tensor, tap.max_tensor) if t)
    wanted = list(dict.fromkeys(wanted))
    outputs = mx.sym.Group([internals[t] for t in wanted])
    probe = Graph(outputs, graph.params, graph.input_names)
    precision = graph.info.precision if graph.info is not None else "fp32"
    block = probe.block(ModelInfo(outputs, list(graph.input_names), precision), fuse=False)
    captured: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for done, item in enumerate(items):
        if iteration is not None and done >= iteration:
            break
        inputs = [data.to_nd(v) for v in data.ordered(split_batch(item)[0], graph.input_names)]
        outputs = data.run(block, inputs)
        values = dict(zip(wanted, outputs if isinstance(outputs, list | tuple) else [outputs]))
        for name, tap in taps.items():
            value = values[tap.tensor]
            if tap.min_tensor and tap.max_tensor:
                value = mx.nd.contrib.dequantize(
                    value, values[tap.min_tensor], values[tap.max_tensor], out_type="float32"
                )
            captured[name].append(value.astype("float32").asnumpy())
    return captured


def _weights(graph: Graph, names: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    int8 = graph.info is not None and graph.info.precision == "int8"
    read = _stored_int8_weights if int8 else _fp32_weights
    found = {name: read(graph, name) for name in names}
    return {name: tensors for name, tensors in found.items() if tensors}


def _fp32_weights(graph: Graph, name: str) -> dict[str, np.ndarray]:
    """The parameters op ``name`` takes as inputs (weight, bias)."""
    nodes = graph.json()["nodes"]
    node: dict[str, Any] = next((n for n in nodes if n["name"] == name), {"inputs": []})
    inputs = [nodes[index]["name"] for index, *_ in node["inputs"]]
    return {t: graph.params[f"arg:{t}"].asnumpy() for t in inputs if f"arg:{t}" in graph.params}


def _stored_int8_weights(graph: Graph, name: str) -> dict[str, np.ndarray]:
    """The int8 weights a quantized model stores for op ``name`` (``W_quantize`` with
    ``W_quantize_min`` / ``_max``), dequantized and keyed by the fp32 name ``W``."""
    mx = mxnet()
    group = group_of(groups(graph.json()), name)
    tensors = {}
    for tensor in group.inputs if group is not None else []:
        stored = [graph.params.get(f"arg:{tensor}{s}") for s in ("", "_min", "_max")]
        if tensor.endswith("_quantize") and all(v is not None for v in stored):
            value = mx.nd.contrib.dequantize(*stored, out_type="float32")
            tensors[tensor.removesuffix("_quantize")] = value.asnumpy()
    return tensors
