"""The weight-only pass: ORT's MatMulNBits quantizer (int4/uint4 blocks), one run per
(bits, block size, scheme)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lpq import ConfigError, ModelError, OpConfig

if TYPE_CHECKING:
    import onnx


def weight_only_pass(
    model: onnx.ModelProto, ops: Mapping[str, OpConfig], options: Mapping[str, Any]
) -> onnx.ModelProto:
    """``ops`` (MatMuls) with block-quantized weights; every other MatMul excluded."""
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as exc:  # onnx-ir missing, or a very old ORT
        raise ModelError(
            f"ONNX Runtime's 4-bit quantizer is unavailable ({exc})",
            hint="pip install onnx-ir (and onnxruntime>=1.18)",
        ) from exc

    groups: dict[tuple[int, int, bool], list[str]] = {}
    for name, cfg in ops.items():
        weight = cfg.weight
        if weight is None or weight.dtype not in ("int4", "uint4"):
            raise ConfigError(
                f"op {name}: weight-only quantization needs an int4 or uint4 weight config",
                hint="use the weight_only options the capability lists for MatMul",
            )
        block = int(weight.options.get("block_size", 32))
        bits = int(weight.options.get("bits", 4))
        groups.setdefault((bits, block, weight.scheme == "sym"), []).append(name)
    matmuls = [node.name for node in model.graph.node if node.op_type == "MatMul"]
    for (bits, block, symmetric), names in groups.items():
        keep = [name for name in matmuls if name not in set(names)]
        try:
            quantizer = MatMulNBitsQuantizer(
                model,
                bits=bits,
                block_size=block,
                is_symmetric=symmetric,
                accuracy_level=options.get("accuracy_level"),
                nodes_to_exclude=keep,
                op_types_to_quantize=("MatMul",),
            )
            quantizer.process()
        except Exception as exc:
            raise ModelError(
                f"ONNX Runtime's {bits}-bit weight quantizer failed ({type(exc).__name__}: {exc})",
                hint="fall back these ops to fp32: " + ", ".join(names),
            ) from exc
        model = quantizer.model.model
    return model
