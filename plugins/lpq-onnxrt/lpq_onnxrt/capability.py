"""Per-op capability of a concrete model, from the capability YAML.

The YAML says what ORT can do per op type; this module pairs it with the prepared model's
nodes and drops options a particular node cannot take (a MatMul whose second input is an
activation has no weight to quantize dynamically or block-wise; an Add on int64 shape
tensors is not a float op at all).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lpq
from lpq.plan.cpu_defaults import order_for_cpu

from . import graph, model_io
from .info import DISTRIBUTION, FRAMEWORK, capability_files

if TYPE_CHECKING:
    import onnx

_FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16
# Op types whose weight (second input) must be a constant for these modes.
_WEIGHT_MODES = {"dynamic", "weight_only"}
# Op types that are compute ops: quantizable even when shape inference gave no types.
_COMPUTE_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
# Elementwise ops left out when an operand is a constant (a bias Add, a scaling Mul):
# quantized alone they add error for no measurable speed (bench: MatMul stack), and a
# user who excludes a layer expects its bias to stay with it.
_ELEMENTWISE = {"Add", "Mul"}


@functools.cache
def _spec_for(files: tuple[Path, ...], version: str | None) -> lpq.CapabilitySpec:
    return lpq.load_capability(list(files), FRAMEWORK, version)


def load_spec(options: Mapping[str, Any] | None = None) -> lpq.CapabilitySpec:
    """The capability spec for the installed ORT (or a backend profile's own file)."""
    options = options or {}
    override = options.get("capability_file")
    files = (Path(override),) if override else tuple(capability_files())
    return _spec_for(files, lpq.installed_version(DISTRIBUTION))


def _is_float_op(node: onnx.NodeProto, types: Mapping[str, int]) -> bool:
    if not node.output:
        return False
    known = types.get(node.output[0])
    if known is None:
        return node.op_type in _COMPUTE_OPS
    return known in _FLOAT_TYPES


def query_capability(
    model: Any, dataloader: Iterable[Any] | None, options: Mapping[str, Any]
) -> lpq.FrameworkCapability:
    """The ``lpq_query_fw_capability`` job: the capability of the prepared ``model`` (a
    path, proto or quantized model). ``dataloader`` is not needed: ORT's capability
    follows from the graph alone."""
    return build_capability(model_io.prepare(model).model, options)


def build_capability(
    model: onnx.ModelProto, options: Mapping[str, Any] | None = None
) -> lpq.FrameworkCapability:
    """The capability of an already prepared ``model`` (see the module docstring)."""
    spec = load_spec(options)
    types = graph.tensor_types(model)
    constants = {init.name for init in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    ops = [
        (node.name, node.op_type)
        for node in model.graph.node
        if spec.for_op_type(node.op_type)
        and _is_float_op(node, types)
        and not (node.op_type in _ELEMENTWISE and any(i in constants for i in node.input))
    ]
    capability = spec.build(ops, lpq.installed_version(DISTRIBUTION))
    # 7-bit weights first where this CPU's u8 x s8 kernels saturate (x86 without VNNI)
    order_for_cpu(capability, lpq.cpu_features())
    by_name = {node.name: node for node in model.graph.node}
    for key in list(capability.opwise):
        node = by_name[key[0]]
        caps = capability.opwise[key]
        if not graph.weight_is_constant(model, node):
            caps = [c for c in caps if c.mode not in _WEIGHT_MODES]
            if node.op_type == "Gather":
                caps = []
        if node.op_type == "MatMul" and not _is_2d_weight(model, node):
            caps = [c for c in caps if c.mode != "weight_only"]
        if caps:
            capability.opwise[key] = caps
        else:
            del capability.opwise[key]
    if not any(
        op_type in _WEIGHTED_MATMULS and graph.weight_is_constant(model, by_name[name])
        for name, op_type in capability.opwise
    ):
        # Nothing for them to act on: searching them would spend trials on copies.
        for name in _MATMUL_RECIPES:
            capability.recipes.pop(name, None)
    return capability


#: Op types the MatMul recipes act on, and those recipes (SmoothQuant moves activation
#: outliers into a MatMul's constant weight; dynamic_weights picks its weights' scales).
_WEIGHTED_MATMULS = ("MatMul", "Gemm")
_MATMUL_RECIPES = ("smoothquant", "dynamic_weights")


def _is_2d_weight(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    for init in model.graph.initializer:
        if len(node.input) > 1 and init.name == node.input[1]:
            return len(init.dims) == 2
    return False


def fused_patterns(model: Any) -> list[tuple[str, ...]]:
    """The capability patterns that occur in the prepared ``model`` as chains of
    single-use tensors (ORT fuses those chains, so they are tuned together)."""
    return _patterns_in(model_io.prepare(model).model)


def _patterns_in(model: onnx.ModelProto) -> list[tuple[str, ...]]:
    spec = load_spec()
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found: list[tuple[str, ...]] = []
    for pattern in sorted(spec.patterns, key=len, reverse=True):
        for node in model.graph.node:
            if node.op_type != pattern[0]:
                continue
            current, matched = node, True
            for op_type in pattern[1:]:
                users = consumers.get(current.output[0], []) if current.output else []
                if len(users) != 1 or users[0].op_type != op_type:
                    matched = False
                    break
                current = users[0]
            if matched and pattern not in found:
                found.append(pattern)
    return found
