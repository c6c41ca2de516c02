"""The backends' parameter files, written from a QDQ ONNX model at deploy.

Every writer reads the quantization parameters from the QDQ model itself (the scales and
zero points of its QuantizeLinear / DequantizeLinear nodes; the integer ranges from the
``lpq.quantization`` metadata when present), so the files always say what the ONNX model
encodes. A writer is named by a profile's ``writer`` field and called as
``writer(model, out_dir, profile)``; it returns ``{file name: what it is}``.

* :func:`write_tensorrt` — ``calibration.cache`` (TensorRT's calibration cache: one
  line per activation tensor, the scale as big-endian float32 hex) and
  ``dynamic_ranges.json`` (``{tensor: amax}``, for ``ITensor::setDynamicRange``), both
  for the float model ``model_fp32.onnx`` (implicit INT8); ``model.onnx`` is the explicit
  Q/DQ form.
* :func:`write_snpe` — ``encodings.json`` in the AIMET format that ``snpe-onnx-to-dlc``
  and ``qnn-onnx-converter`` take as ``--quantization_overrides``, with
  ``model_fp32.onnx``.
* :func:`write_vitis` — ``fix_points.json``: each tensor's bit width and fixed-point
  position (``scale = 2 ** -fix_point``).
* :func:`write_summary` — ``quantization.json``: every quantized tensor's scale, zero
  point, integer range and kind (every writer adds it).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

import lpq
from lpq import ModelError

#: TensorRT's calibration cache header: the version that wrote it and the calibrator.
TENSORRT_CACHE_HEADER = "TRT-8601-EntropyCalibration2"
_METADATA = "lpq.quantization"


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover
        raise ModelError(
            "writing backend files needs the onnx package", hint="pip install onnx"
        ) from exc
    return onnx


def read_qdq(model: Any) -> dict[str, dict[str, Any]]:
    """Every quantized tensor of a QDQ model: ``{tensor: {kind, scale, zero_point, qmin,
    qmax, bits, signed, axis}}`` (``scale``/``zero_point`` are lists, one per channel)."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    props = {p.key: p.value for p in model.metadata_props}
    known = json.loads(props.get(_METADATA, "{}"))
    found: dict[str, dict[str, Any]] = {}
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        source = node.input[0]
        constant = node.op_type == "DequantizeLinear" and source in inits
        if node.op_type == "DequantizeLinear" and not constant:
            continue
        tensor = node.output[0] if constant else source
        scale = inits[node.input[1]].astype(np.float32).reshape(-1)
        zero = (
            inits[node.input[2]].reshape(-1)
            if len(node.input) > 2 and node.input[2]
            else np.zeros(scale.shape, np.uint8)
        )
        info = np.iinfo(zero.dtype if not constant else inits[source].dtype)
        entry: dict[str, Any] = {
            "kind": "bias"
            if constant and info.bits == 32
            else "weight"
            if constant
            else "activation",
            "scale": [float(v) for v in scale],
            "zero_point": [int(v) for v in zero],
            "qmin": int(info.min),
            "qmax": int(info.max),
            "signed": bool(info.min < 0),
            "axis": next((a.i for a in node.attribute if a.name == "axis"), 1)
            if scale.size > 1
            else None,
        }
        extra = known.get(tensor, {})
        for key in ("qmin", "qmax", "kind", "symmetric", "pow2", "rounding"):
            if key in extra:
                entry[key] = extra[key]
        entry["bits"] = int(extra.get("bits", (entry["qmax"] - entry["qmin"]).bit_length()))
        found[tensor] = entry
    if not found:
        raise ModelError(
            "the ONNX model has no QuantizeLinear/DequantizeLinear nodes: nothing is quantized",
            hint="deploy a model quantized for the backend",
        )
    return found


def strip_qdq(model: Any) -> Any:
    """The float model with the same tensor names: Q/DQ pairs removed, quantized constants
    replaced by their dequantized values (what implicit-quantization tools read)."""
    onnx = _onnx()
    from onnx import numpy_helper

    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    inits = {i.name: i for i in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    rename: dict[str, str] = {}
    dropped: set[int] = set()
    floats = []
    for index, node in enumerate(graph.node):
        if node.op_type != "DequantizeLinear":
            continue
        source = node.input[0]
        if source in inits:
            codes = numpy_helper.to_array(inits[source]).astype(np.int64)
            scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            zero = (
                numpy_helper.to_array(inits[node.input[2]]).astype(np.int64)
                if len(node.input) > 2 and node.input[2]
                else np.zeros_like(scale, np.int64)
            )
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if scale.size > 1:
                shape = [1] * codes.ndim
                shape[axis] = -1
                scale, zero = scale.reshape(shape), zero.reshape(shape)
            value = (codes - zero).astype(np.float32) * scale
            floats.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
            dropped.add(index)
            continue
        chain = [node]
        current = producers.get(source)
        while current is not None and current.op_type in ("Clip", "QuantizeLinear"):
            chain.append(current)
            if current.op_type == "QuantizeLinear":
                break
            current = producers.get(current.input[0])
        if chain[-1].op_type != "QuantizeLinear":
            continue
        rename[node.output[0]] = chain[-1].input[0]
        dropped.update(i for i, n in enumerate(graph.node) if any(n is c for c in chain))
    kept = [n for i, n in enumerate(graph.node) if i not in dropped]
    for node in kept:
        for position, name in enumerate(node.input):
            node.input[position] = rename.get(name, name)
    for output in graph.output:
        output.name = rename.get(output.name, output.name)
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in kept for name in node.input}
    remaining = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(remaining + [f for f in floats if f.name in used])
    entry = result.metadata_props.add()
    entry.key, entry.value = "lpq.dequantized", "true"
    onnx.checker.check_model(result)
    return result


def _write_text(path: Path, text: str) -> None:
    with lpq.atomic_write(path, "w") as handle:
        handle.write(text)


def _write_model(path: Path, model: Any) -> None:
    with lpq.atomic_write(path, "wb") as handle:
        handle.write(model.SerializeToString())


def write_summary(model: Any, out_dir: Path, profile: Any = None) -> dict[str, str]:
    """``quantization.json``: every quantized tensor of the QDQ model, with its parameters."""
    entries = read_qdq(model)
    data = {
        "format": "lpq-quantization/1",
        "backend": getattr(profile, "name", None),
        "tensors": entries,
    }
    lpq.write_json(Path(out_dir) / "quantization.json", data)
    return {"quantization.json": "every quantized tensor: scale, zero point, integer range"}


def _activations(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in entries.items() if v["kind"] == "activation"}


def write_tensorrt(model: Any, out_dir: Path, profile: Any = None) -> dict[str, str]:
    """TensorRT: calibration cache and dynamic ranges for the float model (implicit INT8)."""
    out_dir = Path(out_dir)
    entries = read_qdq(model)
    lines, ranges = [TENSORRT_CACHE_HEADER], {}
    for tensor, entry in _activations(entries).items():
        scale = entry["scale"][0]
        if entry["zero_point"][0] != 0 or not entry["signed"]:
            raise ModelError(
                f"TensorRT quantizes symmetrically, but tensor {tensor} has zero point "
                f"{entry['zero_point'][0]}",
                hint="deploy a model quantized with the tensorrt profile",
            )
        lines.append(f"{tensor}: {struct.pack('>f', scale).hex()}")
        ranges[tensor] = scale * entry["qmax"]
    _write_text(out_dir / "calibration.cache", "\n".join(lines) + "\n")
    lpq.write_json(out_dir / "dynamic_ranges.json", ranges)
    _write_model(out_dir / "model_fp32.onnx", strip_qdq(model))
    return {
        "calibration.cache": "TensorRT calibration cache for model_fp32.onnx (implicit INT8: "
        "trtexec --onnx=model_fp32.onnx --int8 --calib=calibration.cache)",
        "dynamic_ranges.json": "per-tensor dynamic ranges (amax) for ITensor::setDynamicRange",
        "model_fp32.onnx": "the float model with the same tensor names (weights already "
        "on their quantization grid)",
        **write_summary(model, out_dir, profile),
    }


def aimet_encoding(entry: dict[str, Any], channel: int = 0) -> dict[str, Any]:
    """One tensor (channel) in AIMET's encoding form: unsigned codes with an offset.

    AIMET writes ``x = (q + offset) * scale`` with ``q`` in ``[0, 2**bitwidth - 1]``; a
    signed int8 code ``s`` with zero point ``z`` is ``q = s + 128`` with
    ``offset = -(z + 128)``.
    """
    bits = int(entry["bits"]) if entry["kind"] != "bias" else 32
    scale = entry["scale"][channel]
    zero = entry["zero_point"][channel]
    container = 8 if bits <= 8 else 16 if bits <= 16 else 32
    offset = -(zero + (2 ** (container - 1) if entry["signed"] else 0))
    return {
        "bitwidth": container,
        "dtype": "int",
        "is_symmetric": str(bool(entry.get("symmetric", zero == 0))),
        "scale": scale,
        "offset": offset,
        "min": offset * scale,
        "max": (2**container - 1 + offset) * scale,
    }


def write_snpe(model: Any, out_dir: Path, profile: Any = None) -> dict[str, str]:
    """SNPE / QNN: AIMET-format encodings for --quantization_overrides, and the float model."""
    out_dir = Path(out_dir)
    entries = read_qdq(model)
    activations = {t: [aimet_encoding(e)] for t, e in _activations(entries).items()}
    params = {
        t: [aimet_encoding(e, c) for c in range(len(e["scale"]))]
        for t, e in entries.items()
        if e["kind"] == "weight"
    }
    data = {"activation_encodings": activations, "param_encodings": params}
    lpq.write_json(out_dir / "encodings.json", data)
    _write_model(out_dir / "model_fp32.onnx", strip_qdq(model))
    return {
        "encodings.json": "AIMET-format encodings (scale, offset, bitwidth per tensor) for "
        "snpe-onnx-to-dlc / qnn-onnx-converter --quantization_overrides",
        "model_fp32.onnx": "the float model the encodings refer to (same tensor names)",
        **write_summary(model, out_dir, profile),
    }


def fix_point(scale: float, tensor: str) -> int:
    position = -math.log2(scale)
    if abs(position - round(position)) > 1e-9:
        raise ModelError(
            f"tensor {tensor} has scale {scale}, not a power of two: Vitis AI's DPU cannot "
            "represent it as a fixed-point position",
            hint="deploy a model quantized with the vitis profile",
        )
    return round(position)


def write_vitis(model: Any, out_dir: Path, profile: Any = None) -> dict[str, str]:
    """Vitis AI: every tensor's bit width and fixed-point position."""
    out_dir = Path(out_dir)
    tensors = {
        tensor: {
            "kind": entry["kind"],
            "bit_width": entry["bits"],
            "fix_point": fix_point(entry["scale"][0], tensor),
            "signed": entry["signed"],
        }
        for tensor, entry in read_qdq(model).items()
        if entry["kind"] != "bias" or len(entry["scale"]) == 1
    }
    data = {"format": "lpq-vitis-fix-points/1", "tensors": tensors}
    lpq.write_json(out_dir / "fix_points.json", data)
    return {
        "fix_points.json": "bit width and fixed-point position per tensor (scale = "
        "2 ** -fix_point), as Vitis AI's quantizers record them",
        **write_summary(model, out_dir, profile),
    }
