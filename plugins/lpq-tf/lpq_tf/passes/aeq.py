"""Quantizing a float ``.tflite`` with Google's ai-edge-quantizer, one recipe entry per op.

A recipe entry matches an op by its *scope*, the op's output tensor name followed by
``;``; later entries win. lpq writes a base entry (the most common static choice, so that
data-movement ops between quantized ops are quantized too, as the converter does), then
one entry per op of the tune_cfg: static int8 / int16 activations, dynamic int8, fp16
weights (float casting) or ``no_quantize`` for fp32. Model inputs and outputs stay float
unless ``io_dtype`` is ``int8``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from lpq import ModelError, OpConfig

from ..calibration import Samples, aeq_calibration
from ..model_io import Prepared
from ..tfenv import quietly


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
    return bytes(result.quantized_model)
