"""Editing a ``.tflite``: the flatbuffer unpacked into ai-edge-litert's object API, changed,
and packed again (:func:`lpq_tf.graph.normalize`, :mod:`lpq_tf.simplify`, the metadata lpq
saves, ai-edge-quantizer's outputs made float).

Every such edit goes through :func:`editable` and :func:`pack`: packing writes only what
lies inside the flatbuffer, so :func:`editable` first moves inside the buffers a model
stores after it; and :func:`drop_tensors` removes the tensors an edit left unused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lpq import ModelError

#: A flatbuffer holds at most 2 GiB: buffers outside it cannot all be moved in beyond that.
_FLATBUFFER_LIMIT = 2**31 - 2**20


def editable(content: bytes, extra_bytes: int = 0) -> Any:
    """``content`` as a ``schema.ModelT`` to edit and repack, with every buffer inside it.

    Repacking drops what lies after the flatbuffer, so buffers stored there (at an offset
    into the file, as ai-edge-quantizer writes some constants) are moved inside first:
    kept as offsets, they would point past the end of the new file, which LiteRT then
    refuses to load ("Constant buffer 34 specified an out of range offset", MediaPipe's
    BlazeFace quantized by ai-edge-quantizer). ``extra_bytes``: what the edit will add."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    outside = [b for b in model.buffers or [] if b.offset > 1 and b.size > 0]
    if len(content) + extra_bytes > _FLATBUFFER_LIMIT and outside:
        raise ModelError(
            f"the .tflite model ({len(content) >> 20} MB) keeps its weights after the "
            "flatbuffer, and lpq cannot rewrite a model this large",
            hint="save the model's bytes (QuantizedModel.content) yourself",
        )
    for buffer in outside:
        buffer.data = np.frombuffer(
            content, dtype=np.uint8, count=buffer.size, offset=buffer.offset
        )
        buffer.offset = buffer.size = 0
    return model


def pack(model: Any, size_hint: int) -> bytes:
    """A ``schema.ModelT`` as ``.tflite`` bytes."""
    import flatbuffers

    builder = flatbuffers.Builder(size_hint + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def drop_tensors(model: Any, unused: set[int]) -> None:
    """Remove the ``unused`` tensors of ``model``'s main subgraph and renumber every
    reference to the others (ai-edge-quantizer's calibrator reads every tensor, and an
    unused activation has no data)."""
    if not unused:
        return
    subgraph = model.subgraphs[0]
    kept = [i for i in range(len(subgraph.tensors)) if i not in unused]
    new = {old: i for i, old in enumerate(kept)}
    subgraph.tensors = [subgraph.tensors[i] for i in kept]

    def renumber(indices: Any) -> list[int]:
        return [new[i] if i >= 0 else i for i in (indices if indices is not None else [])]

    subgraph.inputs, subgraph.outputs = renumber(subgraph.inputs), renumber(subgraph.outputs)
    for op in subgraph.operators:
        op.inputs, op.outputs = renumber(op.inputs), renumber(op.outputs)
        if op.intermediates is not None:
            op.intermediates = renumber(op.intermediates)
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == 0:
            for entry in [*(signature.inputs or []), *(signature.outputs or [])]:
                entry.tensorIndex = new[entry.tensorIndex]
