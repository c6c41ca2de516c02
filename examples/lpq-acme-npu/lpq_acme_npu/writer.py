"""Step 3 of docs/adding-a-backend.md: the Acme NPU's parameter file.

Acme's compiler (imaginary) reads ``acme_npu.json``: for each quantized tensor its shift
(``scale = 2 ** -shift``, one per channel for weights) and its bit width. Everything is
read from the QDQ ONNX model lpq exported, so the file always agrees with it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lpq


def _quantized_tensors(model: Any) -> dict[str, list[float]]:
    """Scales of every QuantizeLinear input and every quantized constant (weights)."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found: dict[str, list[float]] = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            found[node.input[0]] = [float(v) for v in inits[node.input[1]].reshape(-1)]
        elif node.op_type == "DequantizeLinear" and node.input[0] in inits:
            codes = inits[node.input[0]]
            if codes.dtype.itemsize == 1:  # int8 weights (int32 biases follow from them)
                found[node.output[0]] = [float(v) for v in inits[node.input[1]].reshape(-1)]
    return found


def write(model: Any, out_dir: Path, profile: Any = None) -> dict[str, str]:
    """Write ``acme_npu.json`` into ``out_dir``; return ``{file name: what it is}``."""
    tensors = {}
    for name, scales in _quantized_tensors(model).items():
        shifts = [-math.log2(s) for s in scales]
        if any(abs(v - round(v)) > 1e-9 for v in shifts):
            raise lpq.ModelError(
                f"tensor {name} has a scale that is not a power of two",
                hint="deploy a model quantized with the acme-npu profile",
            )
        tensors[name] = {"bits": 8, "shift": [round(v) for v in shifts]}
    lpq.write_json(Path(out_dir) / "acme_npu.json", {"format": "acme-npu/1", "tensors": tensors})
    return {"acme_npu.json": "shift (scale = 2**-shift) and bit width per tensor, for acmec"}
