"""The token embedding as ``com.microsoft.GatherBlockQuantized`` (int8 or int4), or float.

An LLM's embedding table is as large as its ``lm_head`` (SmolLM2-135M: 49152 x 576, 113
MB in fp32, a fifth of the model) but is only read row by row, so quantizing it saves
size and memory, not time. ORT 1.32's CPU kernel takes ``uint8`` data with ``bits`` 4 or 8
(4-bit codes two per byte, low nibble first), blocks along the last axis, ``gather_axis``
0, and optional ``uint8`` zero points packed like the data (absent: ``2**(bits-1)``,
lpq's symmetric mode): exactly :func:`lpq.weight_only.pack_matmulnbits`'s layout for the
transposed table, so the same codes serve a tied ``lm_head`` and the embedding.

``embedding`` option: ``fp32`` (default without calibration data), ``int8``, ``int4``, or
``auto`` (default with data): the calibration windows run through the float model from
the float, int4 and int8 embeddings (:class:`.stages.StagedRun` streams) and the narrowest
one whose ``lm_head`` logits keep top-1 agreement >= 0.99 and mean KL <= 0.01 against the
float embedding's is kept (the ``lm_head`` thresholds). Blocks are 32 wide and symmetric
unless the tied head's int8 codes can be shared (then its block and scheme).

A tied table: when ``lm_head`` is written as MatMulNBits with the same bits, block size
and symmetric scheme as the embedding, RTN on the same numbers gives the same codes, so
the GatherBlockQuantized reads the head's ``B`` initializer itself (3-D, quantized along
its last axis, and a Reshape back to the hidden size): one table in the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError
from lpq.weight_only import BlockQuantized, dequantize_blocks, pack_matmulnbits, quantize_rtn

from .nodes import MS_DOMAIN, ensure_ms_opset

if TYPE_CHECKING:
    import onnx

    from .plan import LmHead

#: ``embedding`` option values.
EMBEDDING_CHOICES = ("auto", "fp32", "int8", "int4")
#: Block size of a quantized embedding that shares nothing with ``lm_head``.
BLOCK = 32


@dataclass(frozen=True)
class Embedding:
    """The token embedding: a Gather (axis 0) over a constant (vocab, hidden) table."""

    node: str
    table: str
    vocab: int
    hidden: int


def find_embedding(model: onnx.ModelProto, head: LmHead | None) -> Embedding | None:
    """The Gather whose table the ``lm_head`` is tied to (or shaped like), else the
    largest Gather over a constant 2-D table, else None."""
    inits = {init.name: init for init in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in inits:
            continue
        table = inits[node.input[0]]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if axis == 0 and len(table.dims) == 2:
            found.append(Embedding(node.name, table.name, int(table.dims[0]), int(table.dims[1])))
    if not found:
        return None
    if head is not None and head.table is not None:
        tied = [e for e in found if e.table == head.table]
        if tied:
            return tied[0]
    return max(found, key=lambda e: e.vocab * e.hidden)


def requested(option: Any, measurable: bool) -> str:
    """The ``embedding`` option, with the default spelled out (``auto`` with data)."""
    value = str(option if option is not None else ("auto" if measurable else "fp32")).lower()
    if value not in EMBEDDING_CHOICES:
        raise ConfigError(
            f"unknown embedding option {option!r}", hint="use " + ", ".join(EMBEDDING_CHOICES)
        )
    if value == "auto" and not measurable:
        return "fp32"
    return value


def rtn_by_columns(
    weight: np.ndarray, bits: int, block: int, symmetric: bool, columns: int = 4096
) -> BlockQuantized:
    """:func:`lpq.weight_only.quantize_rtn` of a (K, N) ``weight`` (a view is fine), a few
    thousand columns at a time: the same codes (columns are independent), without the
    float temporaries of a whole 49152-wide head or table at once."""
    parts = [
        quantize_rtn(np.ascontiguousarray(weight[:, at : at + columns]), bits, block, symmetric)
        for at in range(0, weight.shape[1], columns)
    ]
    return BlockQuantized(
        np.concatenate([p.codes for p in parts], axis=1),
        np.concatenate([p.scales for p in parts], axis=1),
        np.concatenate([p.zero_points for p in parts], axis=1),
        bits,
        block,
        symmetric,
    )


def quantize_table(table: np.ndarray, bits: int, block: int, symmetric: bool) -> BlockQuantized:
    """RTN of the transposed table: a (hidden, vocab) weight, blocks along hidden, as a
    tied ``lm_head``'s MatMulNBits would be quantized."""
    return rtn_by_columns(table.T, bits, block, symmetric)


def rows(quantized: BlockQuantized) -> Any:
    """A function of token ids -> their dequantized embedding rows (ids.shape + (hidden,))."""

    def take(ids: np.ndarray) -> np.ndarray:
        flat = np.asarray(ids, dtype=np.int64).reshape(-1)
        cols = dequantize_blocks(
            quantized.codes[:, flat],
            quantized.scales[:, flat],
            quantized.zero_points[:, flat],
            quantized.block_size,
        )
        return np.ascontiguousarray(cols.T).reshape(*np.shape(ids), quantized.shape[0])

    return take


def fits(embedding: Embedding, block: int) -> str | None:
    """Why the table cannot be block-quantized for GatherBlockQuantized, or None."""
    if embedding.hidden % block:
        return f"hidden size {embedding.hidden} is not a multiple of the block size {block}"
    return None


def write(
    model: onnx.ModelProto,
    embedding: Embedding,
    quantized: BlockQuantized,
    shared_b: str | None = None,
    indices_rank: int | None = None,
) -> list[str]:
    """Replace the embedding Gather of ``model`` (in place) by GatherBlockQuantized over
    ``quantized`` (the transposed table's codes); with ``shared_b`` (a tied head's
    MatMulNBits ``B``, same codes) and a known ``indices_rank``, read that initializer
    instead of writing the codes again. Returns the names of the new initializers."""
    import onnx
    from onnx import numpy_helper

    node = next(n for n in model.graph.node if n.name == embedding.node)
    packed = pack_matmulnbits(quantized)
    vocab, nb = embedding.vocab, packed.scales.shape[1]
    base = f"{embedding.node}_Q{packed.bits}"
    new: list[onnx.TensorProto] = []
    out = node.output[0]
    extra: list[onnx.NodeProto] = []
    if shared_b is not None and indices_rank is not None and packed.zero_points is None:
        data, axis = shared_b, 2
        new.append(numpy_helper.from_array(packed.scales.reshape(vocab, nb, 1), base + "_scales"))
        gathered = base + "_blocks"
        shape = np.array([0] * indices_rank + [embedding.hidden], dtype=np.int64)
        new.append(numpy_helper.from_array(shape, base + "_shape"))
        extra.append(
            onnx.helper.make_node(
                "Reshape", [gathered, base + "_shape"], [out], name=base + "_reshape"
            )
        )
    else:
        data, axis, gathered = base + "_data", 1, out
        new.append(numpy_helper.from_array(packed.b.reshape(vocab, -1), data))
        new.append(numpy_helper.from_array(packed.scales, base + "_scales"))
    inputs = [data, node.input[1], base + "_scales"]
    if packed.zero_points is not None:
        new.append(numpy_helper.from_array(packed.zero_points, base + "_zero_points"))
        inputs.append(base + "_zero_points")
    gbq = onnx.helper.make_node(
        "GatherBlockQuantized",
        inputs,
        [gathered],
        name=base,
        domain=MS_DOMAIN,
        bits=packed.bits,
        block_size=packed.block_size,
        gather_axis=0,
        quantize_axis=axis,
    )
    position = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    for offset, made in enumerate([gbq, *extra]):
        model.graph.node.insert(position + offset, made)
    model.graph.initializer.extend(new)
    ensure_ms_opset(model)
    return [t.name for t in new]


def decide(measured: Mapping[str, Mapping[str, float]], min_agreement: float, max_kl: float) -> str:
    """The narrowest stream (int4, then int8) whose logits met both thresholds, else fp32."""
    for kind in ("int4", "int8"):
        found = measured.get(kind)
        if found and found["top1_agreement"] >= min_agreement and found["mean_kl"] <= max_kl:
            return kind
    return "fp32"
