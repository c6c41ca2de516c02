"""Running chosen nodes in fp16 or bf16 by casting around them.

Each listed node gets its float inputs cast to the low-precision type and its outputs
cast back to float32, so the rest of the graph is unchanged. ORT's CPU provider has fp16
kernels for most ops (and inserts its own casts where it lacks one) but bf16 kernels only
for a few data-movement ops, so every converted model is loaded once to check: an op with
no kernel is a :class:`lpq.ModelError` naming it, never a model that fails later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lpq import ConfigError, ModelError

from . import model_io

if TYPE_CHECKING:
    import onnx

_ONNX_TYPE = {"fp16": 10, "bf16": 16}
_FLOAT32 = 1


def cast_nodes(model: onnx.ModelProto, precisions: Mapping[str, str]) -> onnx.ModelProto:
    """A copy of ``model`` with each named node run in its precision (fp16 / bf16).

    Also the last pass of :func:`lpq_onnxrt.quantize.quantize`, for ops a tune_cfg keeps
    in low-precision float."""
    from onnx import helper

    from .graph import tensor_types

    for name, precision in precisions.items():
        if precision not in _ONNX_TYPE:
            raise ConfigError(
                f"node {name}: cannot convert to {precision!r}", hint="use fp16 or bf16"
            )
    # Quantizers add tensors without value_info: infer types afresh.
    work = model_io.infer_shapes(model_io.copy_model(model))
    types = tensor_types(work)
    nodes = {node.name: node for node in work.graph.node}
    missing = [name for name in precisions if name not in nodes]
    if missing:
        raise ConfigError(
            f"cannot convert node(s) {', '.join(missing)}: not in the model",
            hint="use node names of the fp32 model (see its capability)",
        )
    new_nodes: list[onnx.NodeProto] = []
    for node in work.graph.node:
        if node.name not in precisions:
            new_nodes.append(node)
            continue
        precision = precisions[node.name]
        target = _ONNX_TYPE[precision]
        for index, name in enumerate(node.input):
            if name and types.get(name) == _FLOAT32:
                cast_out = f"{name}__lpq_{precision}_{node.name}"
                new_nodes.append(
                    helper.make_node(
                        "Cast",
                        [name],
                        [cast_out],
                        name=f"{node.name}__lpq_cast_in{index}",
                        to=target,
                    )
                )
                node.input[index] = cast_out
        after: list[onnx.NodeProto] = []
        for index, name in enumerate(node.output):
            if name and types.get(name, _FLOAT32) == _FLOAT32:
                low = f"{name}__lpq_{precision}"
                node.output[index] = low
                after.append(
                    helper.make_node(
                        "Cast", [low], [name], name=f"{node.name}__lpq_cast_out{index}", to=_FLOAT32
                    )
                )
        new_nodes.append(node)
        new_nodes.extend(after)
    del work.graph.node[:]
    work.graph.node.extend(new_nodes)
    # Old value_info entries describe the renamed tensors as float32: drop them.
    kept = [vi for vi in work.graph.value_info if "__lpq_" not in vi.name]
    del work.graph.value_info[:]
    work.graph.value_info.extend(kept)
    _check_kernels(work, precisions, nodes)
    return work


def _check_kernels(
    model: onnx.ModelProto, precisions: Mapping[str, str], nodes: Mapping[str, Any]
) -> None:
    from .session import create_session

    try:
        create_session(model)
    except ModelError as exc:
        listed = ", ".join(
            f"{name} ({nodes[name].op_type} in {p})" for name, p in precisions.items()
        )
        raise ModelError(
            f"ONNX Runtime's CPU provider has no kernel for some of: {listed} ({exc.message})",
            hint="keep these ops in fp32 (bf16 runs only Concat/Transpose/Clip on CPU), or "
            "use fp16",
        ) from None


def cast_lowp(model: Any, op_names: Sequence[str], dtype: str) -> Any:
    """The ``lpq_convert_bf16`` job: ``op_names`` run in ``dtype``; an fp32 model (path or
    proto) gives a proto, a quantized model a quantized model."""
    from .qmodel import QuantizedModel

    precisions = dict.fromkeys(op_names, dtype)
    if isinstance(model, QuantizedModel):
        return QuantizedModel(
            cast_nodes(model.proto, precisions),
            model.tune_cfg,
            dict(model.ranges),
            dict(model.options),
        )
    prepared = model_io.prepare(model)
    return cast_nodes(prepared.model, precisions)
