"""Per-op capability of a concrete model, from the capability YAML and its float .tflite.

The YAML says what LiteRT can run quantized per TFLite op type; this module pairs it with
the ops of the model's float ``.tflite`` (named after Keras layers where possible) and
drops what a particular op cannot take: ops whose output is not float (shape arithmetic
on int32), and dynamic mode for ops without a constant weight.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import lpq

from .info import FRAMEWORK, capability_files, installed_distribution
from .model_io import Prepared, prepare

#: Input index of the weight of ops that have one.
_WEIGHT_INPUT = {
    "CONV_2D": 1,
    "DEPTHWISE_CONV_2D": 1,
    "FULLY_CONNECTED": 1,
    "BATCH_MATMUL": 1,
    "TRANSPOSE_CONV": 1,
}


@functools.cache
def _spec_for(files: tuple[Path, ...], version: str | None) -> lpq.CapabilitySpec:
    return lpq.load_capability(list(files), FRAMEWORK, version)


def load_spec(options: Mapping[str, Any] | None = None) -> lpq.CapabilitySpec:
    """The capability spec for the installed TensorFlow (or a profile's own file)."""
    override = (options or {}).get("capability_file")
    files = (Path(override),) if override else tuple(capability_files())
    return _spec_for(files, lpq.installed_version(installed_distribution()))


def quantizable_ops(
    prepared: Prepared, options: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """``(lpq name, op type)`` of the float ops whose type the YAML can quantize."""
    spec = load_spec(options)
    graph = prepared.graph
    return [
        (prepared.names[op.index], op.op_type)
        for op in graph.model_ops()
        if op.outputs
        and graph.tensors[op.outputs[0]].dtype == np.float32
        and spec.for_op_type(op.op_type)
    ]


def query_capability(
    model: Any, dataloader: Iterable[Any] | None, options: dict[str, Any]
) -> lpq.FrameworkCapability:
    """The ``lpq_query_fw_capability`` answer for any supported input.

    The dataloader is not needed: what an op can take follows from its type and its
    constant inputs in the float ``.tflite``.
    """
    return build_capability(prepare(model), options)


def build_capability(
    prepared: Prepared, options: Mapping[str, Any] | None = None
) -> lpq.FrameworkCapability:
    """The YAML's choices for every quantizable op, minus what the op cannot take."""
    spec = load_spec(options)
    graph = prepared.graph
    ops = quantizable_ops(prepared, options)
    capability = spec.build(ops, lpq.installed_version(installed_distribution()))
    by_name = {prepared.names[op.index]: op for op in graph.model_ops()}
    for key in list(capability.opwise):
        op = by_name[key[0]]
        index = _WEIGHT_INPUT.get(op.op_type)
        constant = (
            index is not None
            and len(op.inputs) > index
            and graph.tensors[op.inputs[index]].buffer is not None
        )
        if not constant:
            caps = [c for c in capability.opwise[key] if c.mode != "dynamic"]
            if caps:
                capability.opwise[key] = caps
            else:
                del capability.opwise[key]
    return capability
