"""Capturing per-node activations and weights of fp32 and quantized models.

Results are keyed by the *fp32* node names so that the tuner can rank nodes by
quantization error. For a quantized node the captured activation is what its consumers
see: the dequantized value after its output's QuantizeLinear/DequantizeLinear pair (QDQ),
or a DequantizeLinear added for the inspection run (QOperator). Weights are dequantized
from their ``*_quantized`` / ``*_scale`` / ``*_zero_point`` initializers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, DataError, Inspection

from . import model_io
from .data import iter_batches
from .graph import follow_activation
from .qmodel import QuantizedModel
from .session import create_session

if TYPE_CHECKING:
    import onnx


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def _activation_tensor(
    model: onnx.ModelProto, op_name: str, fp32_output: str | None, added: list[Any]
) -> str:
    """The tensor holding ``op_name``'s (dequantized) output in ``model``."""
    from onnx import helper

    nodes = {node.name: node for node in model.graph.node}
    produced = {out: node for node in model.graph.node for out in node.output}
    consumers = _consumers(model)
    tensor = None
    if op_name in nodes and nodes[op_name].output:
        tensor = follow_activation(consumers, nodes[op_name].output[0])
    elif fp32_output in produced:
        tensor = fp32_output
    elif (fp32_output and f"{fp32_output}_quantized" in produced) or f"{op_name}_quant" in nodes:
        # QOperator: the node became QLinear*; dequantize its output for inspection. Found
        # by its output, or by name where ORT dropped the Relu after it and kept the conv's
        # own output name (PP-OCRv4 det's squeeze-excite convs: ``p2o.Conv.22_quant``
        # writes ``conv2d_461.tmp_0_quantized``, where the fp32 op's output is the Relu's).
        qnode = produced.get(f"{fp32_output}_quantized") or nodes[f"{op_name}_quant"]
        # Output scale / zero point: inputs 6, 7 of QLinearConv/QLinearMatMul/QLinearAdd,
        # 7, 8 of QGemm (after the bias); a QGemm without them outputs float already.
        first = 7 if qnode.op_type == "QGemm" else 6
        if len(qnode.input) < first + 2 or not qnode.input[first]:
            return str(qnode.output[0])
        tensor = f"{fp32_output}__lpq_inspect"
        added.append(
            helper.make_node(
                "DequantizeLinear",
                [qnode.output[0], qnode.input[first], qnode.input[first + 1]],
                [tensor],
                name=f"{op_name}__lpq_inspect_dq",
            )
        )
        return tensor
    if tensor is None:
        raise ConfigError(
            f"node {op_name!r} is not in the model",
            hint="inspect nodes by their fp32 names (those in the capability)",
        )
    for q in consumers.get(tensor, []):
        if q.op_type == "QuantizeLinear":
            for dq in consumers.get(q.output[0], []):
                if dq.op_type == "DequantizeLinear":
                    return str(dq.output[0])
    return tensor


def _weight_values(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    inits = {init.name: init for init in model.graph.initializer}
    values: dict[str, np.ndarray] = {}
    for name in names:
        if name in inits and inits[name].data_type in (1, 10, 16):
            values[name] = numpy_helper.to_array(inits[name]).astype(np.float32)
            continue
        q, s, z = (
            inits.get(f"{name}_quantized"),
            inits.get(f"{name}_scale"),
            inits.get(f"{name}_zero_point"),
        )
        if q is None or s is None:
            continue
        data = numpy_helper.to_array(q).astype(np.float32)
        scale = numpy_helper.to_array(s).astype(np.float32)
        zero = (
            numpy_helper.to_array(z).astype(np.float32) if z is not None else np.zeros_like(scale)
        )
        if scale.ndim == 1 and scale.size > 1:
            axis = 0 if data.shape[0] == scale.size else data.ndim - 1
            shape = [1] * data.ndim
            shape[axis] = scale.size
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        values[name] = ((data - zero) * scale).astype(np.float32)
    return values


def inspect_tensor(
    model: Any,
    dataloader: Iterable[Any],
    op_names: Sequence[str] | None,
    kind: str,
    iteration: int | None,
) -> Inspection:
    """The ``lpq_inspect_tensor`` job: activations (over ``iteration`` batches at most)
    and/or weights of ``op_names`` (default: every op of the capability), keyed by fp32
    node name, so the tuner can compare an fp32 and a quantized model op by op."""
    if kind not in ("activation", "weight", "both"):
        raise ConfigError(
            f"unknown inspection kind {kind!r}", hint="use activation, weight or both"
        )
    if isinstance(model, QuantizedModel):
        proto = model.proto
        outputs, weights = model.fp32_outputs, model.fp32_weights
        default_names = [name for name, _ in model.tune_cfg.ops]
    else:
        from .capability import build_capability
        from .graph import node_outputs, node_weights

        proto = model_io.prepare(model).model
        outputs, weights = node_outputs(proto), node_weights(proto)
        default_names = [name for name, _ in build_capability(proto).opwise]
    names = list(op_names) if op_names is not None else default_names
    result = Inspection()

    if kind in ("weight", "both"):
        for name in names:
            values = _weight_values(proto, weights.get(name, []))
            if values:
                result.weights[name] = values
    if kind == "weight":
        return result

    work = model_io.copy_model(proto)
    added: list[Any] = []
    targets = {name: _activation_tensor(work, name, outputs.get(name), added) for name in names}
    work.graph.node.extend(added)
    existing = {out.name for out in work.graph.output}
    for tensor in dict.fromkeys(targets.values()):
        if tensor not in existing:
            work.graph.output.add().name = tensor  # ORT infers the type
    session = create_session(work, {"graph_optimization_level": "disable"})
    fetch = list(dict.fromkeys(targets.values()))
    for name in names:
        result.activations[name] = []
    for batch, (feed, _) in enumerate(iter_batches(proto, dataloader)):
        if iteration is not None and batch >= iteration:
            break
        try:
            values = dict(zip(fetch, session.run(fetch, feed)))
        except Exception as exc:
            raise DataError(f"ONNX Runtime could not run batch {batch}: {exc}") from None
        for name, tensor in targets.items():
            result.activations[name].append(np.asarray(values[tensor], dtype=np.float32))
    return result
