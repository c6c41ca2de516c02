"""Quantizing a float ``.tflite`` with Google's ai-edge-quantizer, one recipe entry per op.

A recipe entry matches an op by its *scope*, the op's output tensor name followed by
``;``; later entries win. lpq writes a base entry (the most common static choice, so that
data-movement ops between quantized ops are quantized too, as the converter does), then
one entry per op of the tune_cfg: static int8 / int16 activations, dynamic int8, fp16
weights (float casting) or ``no_quantize`` for fp32. Model inputs and outputs stay float
unless ``io_dtype`` is ``int8`` (:func:`float_outputs` makes sure of the outputs).

The base entry quantizes every op the tune_cfg does not name (RESHAPE, PAD, ...), also
where it only moves the float output of an op kept fp32:
:func:`~lpq_tf.passes.moving.following_float` keeps those in fp32 too.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from lpq import ModelError, OpConfig

from ..calibration import Samples, aeq_calibration
from ..model_io import Prepared
from ..tfenv import quietly
from .moving import following_float


def _import_aeq() -> tuple[Any, Any]:
    try:
        from ai_edge_quantizer import qtyping, quantizer
    except Exception as exc:  # missing, or built for another LiteRT
        raise ModelError(
            f"ai-edge-quantizer is needed for this model but cannot be imported ({exc})",
            hint="pip install ai-edge-quantizer (matching your ai-edge-litert); without it "
            "lpq-tf quantizes Keras models and SavedModels with whole-model int8, 16x8 or "
            "dynamic settings and per-op fp32 fallback of int8, but not .tflite inputs",
        ) from None
    return qtyping, quantizer


def _granularity(qtyping: Any, cfg: OpConfig) -> Any:
    if cfg.weight is not None and cfg.weight.granularity == "per_tensor":
        return qtyping.QuantGranularity.TENSORWISE
    return qtyping.QuantGranularity.CHANNELWISE


def _add(tool: Any, qtyping: Any, regex: str, cfg: OpConfig) -> None:
    every = qtyping.TFLOperationName.ALL_SUPPORTED
    if not cfg.quantized:
        if cfg.precision == "fp16":
            tool.update_quantization_recipe(
                regex=regex,
                operation_name=every,
                op_config=qtyping.OpQuantizationConfig(
                    weight_tensor_config=qtyping.TensorQuantizationConfig(
                        num_bits=16, dtype=qtyping.TensorDataType.FLOAT
                    ),
                    compute_precision=qtyping.ComputePrecision.FLOAT,
                    explicit_dequantize=True,
                ),
                algorithm_key="float_casting",
            )
        else:
            tool.update_quantization_recipe(
                regex=regex, operation_name=every, algorithm_key="no_quantize"
            )
    elif cfg.mode == "dynamic":
        tool.add_dynamic_config(regex, every, 8, _granularity(qtyping, cfg))
    else:
        bits = 16 if cfg.activation is not None and cfg.activation.dtype == "int16" else 8
        tool.add_static_config(regex, every, bits, 8, _granularity(qtyping, cfg))


def quantize_with_aeq(
    prepared: Prepared, by_tensor: dict[str, OpConfig], samples: Samples | None, io_dtype: str
) -> bytes:
    """The quantized model; ``by_tensor`` maps float output tensor names to choices."""
    qtyping, quantizer = _import_aeq()
    tool = quantizer.Quantizer(prepared.float_tflite)
    static = Counter(cfg for cfg in by_tensor.values() if cfg.quantized and cfg.mode == "static")
    if static:
        _add(tool, qtyping, ".*", static.most_common(1)[0][0])
        fallback = OpConfig.fallback()
        by_tensor = {**{t: fallback for t in following_float(prepared, by_tensor)}, **by_tensor}
    for tensor, cfg in by_tensor.items():
        _add(tool, qtyping, "^" + re.escape(tensor) + ";", cfg)
    if io_dtype != "int8":
        for boundary in (qtyping.TFLOperationName.INPUT, qtyping.TFLOperationName.OUTPUT):
            tool.update_quantization_recipe(
                regex=".*", operation_name=boundary, algorithm_key="no_quantize"
            )
    ranges = aeq_calibration(prepared, samples) if samples is not None else None
    result = quietly(
        lambda: tool.quantize(ranges, enable_progress_report=False),
        lambda exc, log: ModelError(
            f"ai-edge-quantizer failed: {type(exc).__name__}: {exc}".splitlines()[0],
            hint="keep the ops it names in fp32\n" + log,
        ),
    )
    quantized = bytes(result.quantized_model)
    return quantized if io_dtype == "int8" else float_outputs(quantized)


def float_outputs(content: bytes) -> bytes:
    """``content`` with every integer graph output made float32 again.

    ai-edge-quantizer quantizes some graph outputs whatever the recipe says for them
    (MediaPipe's BlazeFace: both int8, its face logits at a step of 1.4 after a Concat
    lpq had kept fp32). An output written by a QUANTIZE of a float tensor is that float
    tensor again (the QUANTIZE goes); any other gets a DEQUANTIZE. The signature keeps its
    output names."""
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    from ..graph import read
    from ..rewrite import drop_tensors, editable, pack

    parsed = read(content)  # the flatbuffer as it is: no unpacking where nothing is to do
    if all(np.dtype(parsed.tensors[t].dtype) == np.float32 for t in parsed.outputs):
        return content
    model = editable(content, 4096)
    subgraph = model.subgraphs[0]
    float32 = schema.TensorType.FLOAT32
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    producer = {t: i for i, op in enumerate(subgraph.operators) for t in op.outputs}
    readers = Counter(t for op in subgraph.operators for t in op.inputs)
    # The outputs a QUANTIZE writes: that op, and the tensor it quantizes.
    quantized_from = {
        t: (producer[t], subgraph.operators[producer[t]].inputs[0])
        for t in subgraph.outputs
        if t in producer
        and codes[subgraph.operators[producer[t]].opcodeIndex] == schema.BuiltinOperator.QUANTIZE
    }
    replaced: dict[int, int] = {}
    dropped_ops: set[int] = set()
    unused: set[int] = set()
    for output in subgraph.outputs:
        if subgraph.tensors[output].type == float32:
            continue
        if output in quantized_from and readers[output] == 0:
            index, source = quantized_from[output]
            if subgraph.tensors[source].type == float32:
                replaced[output] = source
                dropped_ops.add(index)
                unused.add(output)  # read by nothing once its QUANTIZE goes
                continue
        if schema.BuiltinOperator.DEQUANTIZE not in codes:
            code = schema.OperatorCodeT()
            code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.DEQUANTIZE
            code.version = 1
            model.operatorCodes.append(code)
            codes.append(schema.BuiltinOperator.DEQUANTIZE)
        value = schema.TensorT()
        value.shape = list(subgraph.tensors[output].shape)
        value.shapeSignature = subgraph.tensors[output].shapeSignature
        value.type, value.buffer = float32, 0
        value.name = (subgraph.tensors[output].name or b"output") + b"_float"
        subgraph.tensors.append(value)
        dequantize = schema.OperatorT()
        dequantize.opcodeIndex = codes.index(schema.BuiltinOperator.DEQUANTIZE)
        dequantize.inputs, dequantize.outputs = [output], [len(subgraph.tensors) - 1]
        subgraph.operators.append(dequantize)
        replaced[output] = len(subgraph.tensors) - 1
    # Each signature output follows its graph output: named by the output tensor itself,
    # or (as ai-edge-quantizer leaves some) by the float tensor its QUANTIZE reads.
    position = {t: k for k, t in enumerate(subgraph.outputs)}
    for k, t in enumerate(subgraph.outputs):
        if t in quantized_from:
            position.setdefault(quantized_from[t][1], k)
    subgraph.outputs = [replaced.get(t, t) for t in subgraph.outputs]
    for signature in model.signatureDefs or []:
        for entry in signature.outputs or []:
            if entry.tensorIndex in position:
                entry.tensorIndex = subgraph.outputs[position[entry.tensorIndex]]
    subgraph.operators = [op for i, op in enumerate(subgraph.operators) if i not in dropped_ops]
    drop_tensors(model, unused)
    return pack(model, len(content) * 2)
