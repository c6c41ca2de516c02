"""Reading a ``.tflite`` flatbuffer: its ops, their tensors and its metadata.

Everything lpq needs to know about a converted model (which ops it has, which precision
each op really runs in, which tensors hold weights) is read from the file itself with
the flatbuffer schema that ``ai-edge-litert`` ships, without TensorFlow and without
building an interpreter (which would fail on models with custom ops).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from lpq import ModelError

#: TFLite tensor type codes -> numpy dtypes (schema.fbs ``TensorType``).
TENSOR_DTYPES: dict[int, Any] = {
    0: np.float32,
    1: np.float16,
    2: np.int32,
    3: np.uint8,
    4: np.int64,
    6: np.bool_,
    7: np.int16,
    9: np.int8,
    10: np.float64,
    16: np.uint32,
    17: np.uint16,
}
#: Ops a quantizer inserts; they are not ops of the user's model.
CONVERSION_OPS = frozenset({"QUANTIZE", "DEQUANTIZE"})


@dataclass(frozen=True)
class Tensor:
    """One tensor of the main subgraph."""

    index: int
    name: str
    dtype: Any
    shape: tuple[int, ...]
    #: Quantization parameters (empty when the tensor is not quantized).
    scale: np.ndarray
    zero_point: np.ndarray
    quantized_dimension: int
    #: Index of its data buffer when the tensor is a constant, else None.
    buffer: int | None


@dataclass(frozen=True)
class Op:
    """One operator of the main subgraph, in execution order."""

    index: int
    op_type: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass
class Graph:
    """The main subgraph of a ``.tflite`` model, parsed once."""

    ops: list[Op]
    tensors: list[Tensor]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    metadata: dict[str, bytes]
    _model: Any

    def output_name(self, op: Op) -> str:
        return self.tensors[op.outputs[0]].name if op.outputs else ""

    def constant(self, index: int) -> np.ndarray | None:
        """The data of a constant tensor, or None for an activation."""
        tensor = self.tensors[index]
        if tensor.buffer is None:
            return None
        buffer = self._model.Buffers(tensor.buffer)
        if _outside(buffer):  # stored after the flatbuffer, at an offset into the file
            start = buffer.Offset()
            raw = bytes(self._model._tab.Bytes[start : start + buffer.Size()])
            return np.frombuffer(raw, dtype=tensor.dtype).reshape(tensor.shape)
        data = buffer.DataAsNumpy()
        if isinstance(data, int):  # no data: an activation
            return None
        return np.frombuffer(data.tobytes(), dtype=tensor.dtype).reshape(tensor.shape)

    def producers(self) -> dict[int, Op]:
        return {out: op for op in self.ops for out in op.outputs}

    def model_ops(self) -> list[Op]:
        """The ops of the user's model: everything but quantize / dequantize."""
        return [op for op in self.ops if op.op_type not in CONVERSION_OPS]


@functools.cache
def _op_names() -> dict[int, str]:
    from ai_edge_litert import schema_py_generated as schema

    return {
        value: name
        for name, value in vars(schema.BuiltinOperator).items()
        if not name.startswith("_") and isinstance(value, int)
    }


def _array(getter: Any) -> np.ndarray:
    if getter is None:
        return np.zeros(0)
    value = getter()
    return np.zeros(0) if isinstance(value, int) else np.asarray(value)


def read(content: bytes) -> Graph:
    """Parse a ``.tflite`` model; :class:`lpq.ModelError` if it is not one."""
    from ai_edge_litert import schema_py_generated as schema

    if len(content) < 8 or content[4:8] != b"TFL3":
        raise ModelError(
            "not a TFLite model (no TFL3 flatbuffer identifier)",
            hint="pass a .tflite file written by the TFLite converter or ai-edge-quantizer",
        )
    try:
        model = schema.Model.GetRootAs(content, 0)
        graph = model.Subgraphs(0)
        names = _op_names()
        ops = []
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            code = model.OperatorCodes(op.OpcodeIndex())
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            op_type = names.get(builtin, f"BUILTIN_{builtin}")
            if op_type == "CUSTOM":
                op_type = (code.CustomCode() or b"CUSTOM").decode()
            ops.append(
                Op(
                    i,
                    op_type,
                    tuple(int(x) for x in _array(op.InputsAsNumpy)),
                    tuple(int(x) for x in _array(op.OutputsAsNumpy)),
                )
            )
        tensors = []
        for i in range(graph.TensorsLength()):
            t = graph.Tensors(i)
            quant = t.Quantization()
            buffer = t.Buffer()
            data = model.Buffers(buffer) if buffer > 0 else None
            has_data = data is not None and (data.DataLength() > 0 or _outside(data))
            tensors.append(
                Tensor(
                    index=i,
                    name=(t.Name() or b"").decode(errors="replace"),
                    dtype=TENSOR_DTYPES.get(t.Type(), np.float32),
                    shape=tuple(int(x) for x in _array(t.ShapeAsNumpy)),
                    scale=_array(quant.ScaleAsNumpy) if quant else np.zeros(0),
                    zero_point=_array(quant.ZeroPointAsNumpy) if quant else np.zeros(0),
                    quantized_dimension=quant.QuantizedDimension() if quant else 0,
                    buffer=buffer if has_data else None,
                )
            )
        metadata = {}
        for i in range(model.MetadataLength()):
            entry = model.Metadata(i)
            data = model.Buffers(entry.Buffer()).DataAsNumpy()
            metadata[(entry.Name() or b"").decode()] = (
                b"" if isinstance(data, int) else data.tobytes()
            )
        return Graph(
            ops=ops,
            tensors=tensors,
            inputs=tuple(int(x) for x in _array(graph.InputsAsNumpy)),
            outputs=tuple(int(x) for x in _array(graph.OutputsAsNumpy)),
            metadata=metadata,
            _model=model,
        )
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"the TFLite model is damaged ({type(exc).__name__}: {exc})",
            hint="re-convert the model",
        ) from None


def _outside(buffer: Any) -> bool:
    """Whether a buffer's data lies after the flatbuffer (``offset`` > 1 and a size), as
    ai-edge-quantizer writes some constants, instead of inside it."""
    return bool(buffer.Offset() > 1 and buffer.Size() > 0)


def with_metadata(content: bytes, entries: dict[str, bytes]) -> bytes:
    """A copy of the model with metadata ``entries`` set (others of the same name
    dropped)."""
    from ai_edge_litert import schema_py_generated as schema

    from .rewrite import editable, pack

    added = sum(len(d) for d in entries.values())
    model = editable(content, added)
    model.metadata = [m for m in (model.metadata or []) if m.name.decode() not in entries]
    model.buffers = model.buffers or []
    for name, data in entries.items():
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(data, dtype=np.uint8)
        model.buffers.append(buffer)
        meta = schema.MetadataT()
        meta.name = name.encode()
        meta.buffer = len(model.buffers) - 1
        model.metadata.append(meta)
    return pack(model, len(content) + added)


def dequantize(tensor: Tensor, values: np.ndarray) -> np.ndarray:
    """Float32 values of a quantized tensor (per-tensor or per-channel)."""
    if tensor.scale.size == 0 or values.dtype.kind == "f":
        return np.asarray(values, dtype=np.float32)
    scale = tensor.scale.astype(np.float32)
    zero = tensor.zero_point.astype(np.float32) if tensor.zero_point.size else np.zeros_like(scale)
    if scale.size > 1 and values.ndim:
        shape = [1] * values.ndim
        shape[tensor.quantized_dimension] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((values.astype(np.float32) - zero) * scale).astype(np.float32)


def normalize(content: bytes) -> bytes:
    """A float ``.tflite`` as lpq's quantizers need it; ``content`` itself if nothing to do.

    * float16 or sparse weights unpacked by DEQUANTIZE / DENSIFY ops (MediaPipe ships its
      models so) become float32 constants (:func:`lpq_tf.simplify.unpacked`): LiteRT
      unpacks them when it loads the model anyway, so the fp32 model computes the same,
      and the quantizers see ordinary float weights;
    * a model without a signature (converted by old tools) gets ``serving_default``,
      which ai-edge-quantizer's calibrator needs;
    * op codes of old schema versions (the op in ``deprecated_builtin_code``, 0 = ADD in
      ``builtin_code``) are upgraded: ai-edge-quantizer reads only ``builtin_code`` and
      would quantize every conv's weights as if it were an ADD's input;
    * standalone RELU / RELU6 / RELU_N1_TO_1 ops are fused into the op before them
      (:mod:`lpq_tf.simplify`): XNNPACK then runs the int8 model in one piece.
    """
    from ai_edge_litert import schema_py_generated as schema

    from . import simplify
    from .rewrite import drop_tensors, editable, pack

    parsed = read(content)
    fusions = simplify.fusions(parsed)
    chains = simplify.unpacked(parsed)
    root = schema.Model.GetRootAs(content, 0)
    has_signature = root.SignatureDefsLength() > 0
    old_codes = any(
        root.OperatorCodes(i).BuiltinCode() < root.OperatorCodes(i).DeprecatedBuiltinCode()
        for i in range(root.OperatorCodesLength())
    )
    if not chains.ops and not fusions and has_signature and not old_codes:
        return content
    model = editable(content)
    for code in model.operatorCodes:
        code.builtinCode = max(code.builtinCode, code.deprecatedBuiltinCode)
    subgraph = model.subgraphs[0]
    for index, weights in simplify.unpacked_values(content, parsed, chains).items():
        buffer = schema.BufferT()
        data = weights.astype(parsed.tensors[index].dtype).tobytes()
        buffer.data = np.frombuffer(data, dtype=np.uint8)
        model.buffers.append(buffer)
        subgraph.tensors[index].buffer = len(model.buffers) - 1
    fused, unused = simplify.fuse(model, fusions)
    unused |= set(chains.inner)
    dropped = set(chains.ops) | fused
    subgraph.operators = [op for i, op in enumerate(subgraph.operators) if i not in dropped]
    if not has_signature:
        signature = schema.SignatureDefT()
        signature.signatureKey = b"serving_default"
        signature.subgraphIndex = 0
        signature.inputs, signature.outputs = [], []
        pairs = ((parsed.inputs, signature.inputs), (parsed.outputs, signature.outputs))
        for indices, target in pairs:
            for index in indices:
                entry = schema.TensorMapT()
                entry.name = parsed.tensors[index].name.encode()
                entry.tensorIndex = index
                target.append(entry)
        model.signatureDefs = [signature]
    drop_tensors(model, unused)  # after the signature: it is renumbered too
    return pack(model, len(content) * 2)
