"""Which embedding the pass writes: float, or GatherBlockQuantized int8 / int4 as asked,
or (``embedding=auto``) the narrowest whose logits on the calibration windows keep
next-token agreement: the calibration run carries int4 and int8 *streams* of the first
batches beside the float one (:class:`.stages.StagedRun`) and compares their logits at
``lm_head`` (:class:`.calibrate.LayerwiseCalibration`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq.weight_only import BlockQuantized

from ... import weights
from . import embedding as emb
from . import source
from .nodes import node_name
from .output import Output
from .plan import LM_HEAD_MAX_KL, LM_HEAD_MIN_AGREEMENT, LayerChoice, LmHead

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

#: The reference stream of a staged calibration run.
REFERENCE = "fp32"


class EmbeddingChoice:
    """The embedding of one pass: what was asked, the streams that measure it, and the
    table quantized to each bit width (once, when a stream or the result needs it)."""

    def __init__(
        self,
        src: onnx.ModelProto,
        head: LmHead | None,
        choices: Mapping[str, LayerChoice],
        options: Mapping[str, Any],
        measurable: bool,
    ) -> None:
        self.src, self.head, self.choices, self.options = src, head, choices, options
        self.inits = {init.name: init for init in src.graph.initializer}
        self.embedding = emb.find_embedding(src, head)
        wanted = emb.requested(options.get("embedding"), measurable)
        self.requested = wanted if self.embedding is not None else "fp32"
        self.tables: dict[int, BlockQuantized] = {}
        self.formats = {bits: self._format(bits) for bits in (4, 8)}

    def _format(self, bits: int) -> tuple[int, bool]:
        """Block size and scheme of a ``bits`` embedding: a tied quantized head's when
        its bits match (so the codes can be shared), else 32 symmetric."""
        head = self.choices.get(self.head.name) if self.head is not None else None
        tied = self.head is not None and self.head.tied and self.head.table is not None
        if tied and head is not None and head.bits == bits:
            return head.block_size, head.symmetric
        return emb.BLOCK, True

    def streams(self) -> dict[str, Any]:
        """The streams that measure the embedding (``auto``): float, int4 and int8."""
        if self.requested != "auto" or self.embedding is None or self.head is None:
            return {}
        if any(emb.fits(self.embedding, block) for block, _ in self.formats.values()):
            return {}
        streams: dict[str, Any] = {REFERENCE: None}
        for bits in (4, 8):
            streams[f"int{bits}"] = self._rows(bits)
        return streams

    def table(self, bits: int) -> BlockQuantized:
        """The embedding table quantized to ``bits`` (once per pass)."""
        assert self.embedding is not None
        if bits not in self.tables:
            block, symmetric = self.formats[bits]
            table = weights.array(self.inits[self.embedding.table])
            self.tables[bits] = emb.quantize_table(table, bits, block, symmetric)
        return self.tables[bits]

    def _rows(self, bits: int) -> Any:
        """A stream's embedding rows, its table quantized when a batch first needs it
        (never, when the calibration is read back from the run's files)."""

        def rows(ids: np.ndarray) -> np.ndarray:
            return emb.rows(self.table(bits))(ids)

        return rows

    def finish(
        self, out: Output, report: dict[str, Any], compared: Mapping[str, Mapping[str, float]]
    ) -> None:
        """Decide (``auto``, from the streams' ``compared`` logits) and write the
        embedding into ``out``; ``report["embedding"]`` says why."""
        entry: dict[str, Any] = {"requested": self.requested}
        report["embedding"] = entry
        if self.embedding is None:
            entry.update(kept="fp32", reason="no Gather over a constant table")
            return
        entry["name"] = self.embedding.node
        kind = self.requested
        if kind == "auto":
            need = float(self.options.get("lm_head_min_agreement", LM_HEAD_MIN_AGREEMENT))
            most = float(self.options.get("lm_head_max_kl", LM_HEAD_MAX_KL))
            measured = {
                k: {
                    "top1_agreement": round(v["top1"] / max(v["rows"], 1), 5),
                    "mean_kl": round(v["kl"] / max(v["rows"], 1), 6),
                    "rows": int(v["rows"]),
                }
                for k, v in compared.items()
            }
            entry["measured"] = measured
            if not measured:
                entry.update(kept="fp32", reason="auto: not measured (no lm_head logits)")
                return
            kind = emb.decide(measured, need, most)
            entry["reason"] = f"auto: {kind} keeps next-token agreement (measured)"
            if kind == "fp32":
                entry["reason"] = "auto: int8 and int4 cost next-token agreement (measured)"
        if kind == "fp32":
            entry.setdefault("reason", "embedding=fp32")
            entry["kept"] = "fp32"
            return
        bits = 8 if kind == "int8" else 4
        block, symmetric = self.formats[bits]
        why = emb.fits(self.embedding, block)
        if why is not None:
            entry.update(kept="fp32", reason=why)
            return
        quantized = self.table(bits)
        self.tables.clear()
        shared = self._shared_head_b(quantized)
        gather = next(n for n in self.src.graph.node if n.name == self.embedding.node)
        rank = source.input_rank(self.src, gather.input[1])
        out.names.update(emb.write(out.model, self.embedding, quantized, shared, rank))
        entry.update(
            kept=kind,
            block_size=block,
            scheme="sym" if symmetric else "asym",
            shared_with_lm_head=bool(shared and rank is not None and quantized.symmetric),
        )
        entry.setdefault("reason", f"embedding={kind}")
        log.info("embedding %s: %s (%s)", self.embedding.node, kind, entry["reason"])

    def _shared_head_b(self, quantized: BlockQuantized) -> str | None:
        """The tied head's MatMulNBits ``B`` when it holds exactly these codes."""
        head = self.head
        if head is None or not head.tied or head.name not in self.choices:
            return None
        choice = self.choices[head.name]
        same = (choice.bits, choice.block_size, choice.symmetric) == (
            quantized.bits,
            quantized.block_size,
            quantized.symmetric,
        )
        if not same or choice.algorithm != "rtn" or not quantized.symmetric:
            return None
        return node_name(head.name, quantized.bits) + "_B"
