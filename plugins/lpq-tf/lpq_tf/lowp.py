"""Running chosen ops with float16 weights; bf16 is refused.

LiteRT's CPU kernels compute in fp32 (or int8): an fp16 model stores float16 weights that
are dequantized when the model loads, halving their size at fp32 speed. Per op, that is
ai-edge-quantizer's float casting; lpq applies it by re-quantizing with those ops set to
fp16 in the tune_cfg. LiteRT has no bf16 kernels, so bf16 is a :class:`lpq.ModelError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lpq import ConfigError, ModelError, OpConfig, TuneConfig

from .capability import load_spec, quantizable_ops
from .model_io import prepare
from .qmodel import QuantizedModel
from .quantize import quantize


def cast_lowp(model: Any, op_names: Sequence[str], dtype: str) -> Any:
    """The ``lpq_convert_bf16`` implementation: fp32 or quantized model in, quantized out.

    fp16 is a per-op choice of the quantizers (float16 weights), so casting ops is
    re-quantizing with those ops set to fp16: a quantized model keeps its tune_cfg and
    calibration samples, an fp32 model gets only the fp16 ops.
    """
    if dtype != "fp16":
        raise ModelError(
            f"LiteRT has no {dtype} kernels on CPU",
            hint="use fp16 (float16 weights), or keep the ops in fp32",
        )
    prepared = prepare(model)
    types = dict(quantizable_ops(prepared))
    missing = [name for name in op_names if name not in types]
    if missing:
        raise ConfigError(
            f"cannot convert op(s) {', '.join(missing[:5])}: not quantizable ops of the model",
            hint="use op names from the model's capability",
        )
    spec = load_spec()
    no_kernel = [n for n in op_names if "fp16" not in spec.float_fallbacks(types[n])]
    if no_kernel:
        raise ModelError(
            f"no float16-weight form for op(s) {', '.join(no_kernel[:5])} "
            f"({', '.join(sorted({types[n] for n in no_kernel}))})",
            hint="fp16 applies to ops with weights (convolutions, fully connected)",
        )
    changes = {(name, types[name]): OpConfig.fallback("fp16") for name in op_names}
    if isinstance(model, QuantizedModel):
        return quantize(prepared, model.tune_cfg.with_ops(changes), model.samples)
    return quantize(prepared, TuneConfig(ops=changes), None)
