"""The weight-only pass: block-quantized MatMul weights as ``MatMulNBits`` (4 or 8 bits).

Each MatMul of the tune_cfg is quantized with its own algorithm (:mod:`lpq.weight_only`:
RTN, GPTQ, AWQ or the scale search), written by lpq itself with integer zero points
(:mod:`.nodes`) and the ``accuracy_level`` measured fastest without costing accuracy
(:mod:`.accuracy_level`). AWQ scales are folded into the producing normalization where
that is safe (:mod:`.awq_fold`). ``lm_head`` (:mod:`.plan`) becomes int8 when that costs
little next-token agreement on the calibration windows, else stays float (a tied float
head reads the embedding table through a Transpose again: one table in the file). The
token embedding (:mod:`.embedding`) becomes GatherBlockQuantized (int4 or int8) when the
logits on the calibration windows say it costs nothing, or on request.

Memory: the input model is only read and the result is a new model written tensor by
tensor (:func:`lpq_onnxrt.weights.shell`): float weights are read one layer at a time,
never copied whole. The calibration windows run one decoder layer at a time
(:mod:`.stages`); the statistics of a layer's MatMul inputs (GPTQ Hessians, AWQ rows,
channel mean squares) are taken, that layer is quantized and they are freed before the
next layer runs. Models that cannot be cut by layer calibrate in budgeted chunks
(:mod:`.activations`). One progress line per layer is logged (INFO, which ``lpq``'s CLI
prints also when its output is not a terminal). What was done per layer is written to
the model's ``metadata_props`` under ``lpq_weight_only`` (JSON).

Options (``tune_cfg.options`` / ``--option``): ``accuracy_level`` (``auto`` or 0..4),
``lm_head`` (``auto``, ``fp32``, ``int8``, ``tuned``; ``lm_head_min_agreement`` 0.99 and
``lm_head_max_kl`` 0.01 for ``auto``), ``embedding`` (``auto``, ``fp32``, ``int8``,
``int4``; the same thresholds), ``gptq_damp`` (0.01), ``gptq_act_order`` (false),
``awq_grid`` (20), ``awq_tokens`` (512 rows per layer), ``calib_budget_mb`` (512:
activations held per calibration chunk when the model is not cut by layer).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, OpConfig
from lpq.weight_only import (
    BlockQuantized,
    awq_search,
    gptq_quantize,
    quantize_rtn,
    search_scales,
)

from ... import weights
from ...data import iter_batches
from . import accuracy_level as levels
from . import embedding as emb
from . import reuse
from .activations import Need, TensorStats, add, collect
from .awq_fold import FoldSite, apply_fold, fold_site
from .nodes import replace_matmul
from .plan import (
    CALIBRATED,
    LM_HEAD_MAX_KL,
    LM_HEAD_MIN_AGREEMENT,
    LayerChoice,
    compare_logits,
    decide_lm_head,
    find_lm_head,
    measure_lm_head,
    read_choices,
)
from .stages import Stage, StagedRun, layer_of, plan_stages

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

METADATA_KEY = "lpq_weight_only"
#: Rows of lm_head's input kept to measure an int8 head (``lm_head=auto``).
HEAD_ROWS = 512
#: The reference stream of a staged calibration run.
REFERENCE = "fp32"
#: Token positions on which the int4/int8 embeddings' logits are compared with float.
COMPARE_ROWS = 512

__all__ = ["METADATA_KEY", "read_report", "weight_only_pass"]


def weight_only_pass(
    model: onnx.ModelProto,
    ops: Mapping[str, OpConfig],
    options: Mapping[str, Any],
    calib_dataloader: Iterable[Any] | None = None,
) -> onnx.ModelProto:
    """A new model: ``model`` (only read) with ``ops`` as MatMulNBits, see the module
    docstring."""
    return _Pass(model, ops, options, calib_dataloader).run()


class _Pass:
    """One run of the pass: what it decided so far, the model being written, and the
    statistics of the layer being quantized."""

    def __init__(
        self,
        model: onnx.ModelProto,
        ops: Mapping[str, OpConfig],
        options: Mapping[str, Any],
        calib: Iterable[Any] | None,
    ) -> None:
        self.src, self.options, self.calib = model, options, calib
        self.nodes = {node.name: node for node in model.graph.node}
        self.inits = {init.name: init for init in model.graph.initializer}
        op_types = {name: self.nodes[name].op_type for name in ops if name in self.nodes}
        self.choices = read_choices(ops, op_types)
        self.report: dict[str, Any] = {"layers": {}, "awq_skipped": {}, "accuracy_level": {}}
        self.head = find_lm_head(model)
        measurable = calib is not None
        self.report["lm_head"] = decide_lm_head(
            self.choices, self.head, options.get("lm_head"), measurable=measurable
        )
        self.head_pending = (
            self.head is not None and (self.report["lm_head"] or {}).get("kept") == "measure"
        )
        self.head_input = (
            self.nodes[self.head.name].input[0]
            if self.head_pending and self.head is not None
            else None
        )
        self.embedding = emb.find_embedding(model, self.head)
        wanted = emb.requested(options.get("embedding"), measurable)
        self.embedding_choice = wanted if self.embedding is not None else "fp32"
        self.out = weights.shell(model)
        self.out_inits: set[str] = set()
        self.written: dict[str, int] = {}  # MatMulNBits node name -> bits
        self.head_quantized: BlockQuantized | None = None
        self.stats: dict[str, TensorStats] = {}
        self.streams: dict[str, Any] = {}
        self.compared: dict[str, dict[str, float]] = {}
        self.sites: dict[str, FoldSite] = {}
        self.tables: dict[int, BlockQuantized] = {}  # the embedding, quantized to measure it
        self.formats = {bits: self._embedding_format(bits) for bits in (4, 8)}

    # ------------------------------------------------------------------ the run
    def run(self) -> onnx.ModelProto:
        self._check_calibration()
        needs = _needs(self.src, self.choices, self.options, self.head_input)
        self.sites = self._awq_sites()
        keep = self._level_inputs()
        stages = plan_stages(self.src)
        streams = self._embedding_streams() if stages is not None else {}
        if (needs or len(streams) > 1) and stages is not None:
            self._staged(stages, needs, streams, keep)
        else:
            if needs:
                budget = int(float(self.options.get("calib_budget_mb", 512)) * (1 << 20))
                assert self.calib is not None
                self.stats = collect(self.src, self.calib, needs, budget_bytes=budget)
            for label, names in _layer_groups(self.src, self.choices, stages):
                self._quantize_layer(label, names)
        self._finish()
        return self.out

    def _check_calibration(self) -> None:
        calibrated = sorted(
            {c.algorithm for c in self.choices.values() if c.algorithm in CALIBRATED}
        )
        if calibrated and self.calib is None:
            raise ConfigError(
                f"weight-only {', '.join(calibrated)} needs calibration data, and none was given",
                hint="pass token windows (CLI: --calib tokens.npz holding input_ids (N, L) int64), "
                "or use algorithm rtn / scale_search",
            )

    def _staged(
        self,
        stages: list[Stage],
        needs: Mapping[str, Need],
        streams: Mapping[str, Any],
        keep: set[str],
    ) -> None:
        """Calibrate and quantize one stage (decoder layer) at a time."""
        assert self.calib is not None
        feeds = [feed for feed, _ in iter_batches(self.src, self.calib, None)]
        names = list(streams or [REFERENCE])
        files = reuse.Calibration.of(
            self.src, feeds, needs, names, [COMPARE_ROWS, sorted(self.formats.items())]
        )
        replay = files is not None and files.complete
        runner = None
        if not replay:
            runner = StagedRun(
                self.src,
                feeds,
                stages,
                streams or None,
                other_batches=_batches_for(feeds, COMPARE_ROWS),
            )
        elif files is not None:  # an earlier trial of this run calibrated the same way
            self.compared = files.load_compared()
            log.info("weight-only calibration: read from this run's files (%s)", files.dir)
        stage_of = {node.name: i for i, stage in enumerate(stages) for node in stage.nodes}
        capture: dict[str, int] = {}  # tensor -> the stage whose run summarises it
        readers: dict[str, list[str]] = {}
        for node in self.src.graph.node:
            if (
                node.input
                and node.input[0] in needs
                and (node.name in self.choices or node.name == getattr(self.head, "name", None))
            ):
                index = stage_of[node.name]
                capture[node.input[0]] = min(capture.get(node.input[0], index), index)
                readers.setdefault(node.input[0], []).append(node.name)
        compare = self._head_input_stage(stages) if len(names) > 1 else None
        layers = sum(1 for s in stages if not s.gather)
        done = 0
        for index, stage in enumerate(stages):
            start = time.perf_counter()
            wanted = [t for t, i in capture.items() if i == index]
            if compare is not None and compare[1] == index:
                wanted.append(compare[0])
            if runner is None and files is not None:
                for tensor in wanted:
                    if tensor in needs and tensor not in self.stats:
                        self.stats[tensor] = files.load(tensor)
            else:
                assert runner is not None
                for tensor in wanted:
                    if tensor in needs and tensor not in self.stats:
                        self.stats[tensor] = TensorStats.start(needs[tensor])
                self._run_stage(runner, index, wanted, needs, compare)
                if files is not None:
                    for tensor in wanted:
                        if tensor in needs:
                            files.save(tensor, self.stats[tensor])
            names = [n.name for n in stage.nodes if n.name in self.choices]
            if not stage.gather:
                done += 1
            if names or self.head_name in stage.names:
                self._quantize_layer(
                    f"{stage.label} ({done}/{layers})", names, time.perf_counter() - start
                )
            finished = {name for s in stages[: index + 1] for name in s.names}
            for tensor in list(self.stats):
                if tensor not in keep and all(r in finished for r in readers.get(tensor, [])):
                    del self.stats[tensor]
            weights.release_free_memory()
        if files is not None and not replay:
            files.save_compared(self.compared)
            files.finish()

    @property
    def head_name(self) -> str | None:
        return self.head.name if self.head is not None else None

    def _run_stage(
        self,
        runner: StagedRun,
        index: int,
        wanted: list[str],
        needs: Mapping[str, Need],
        compare: tuple[str, int] | None,
    ) -> None:
        """Run one stage: the reference stream feeds the statistics; at the stage that
        makes lm_head's input, every stream's logits are compared with the reference's."""
        at_head = compare is not None and compare[1] == index
        head_weight: np.ndarray | None = None
        pending: dict[str, np.ndarray] = {}
        for _, stream, values in runner.run(index, wanted):
            if stream == REFERENCE:
                for tensor, value in values.items():
                    if tensor in needs:
                        add(self.stats[tensor], needs[tensor], value)
            if not at_head or compare is None:
                continue
            pending[stream] = values[compare[0]]
            if len(pending) < len(runner.streams):
                continue
            if head_weight is None:
                head_weight = _weight(self.src, self.nodes[self.head_name or ""])
            reference = pending.pop(REFERENCE)
            found = {name: self.compared.setdefault(name, {}) for name in pending}
            _accumulate(found, reference, pending, head_weight)
            pending = {}

    # ---------------------------------------------------------- quantizing a layer
    def _quantize_layer(self, label: str, names: list[str], calib_s: float = 0.0) -> None:
        """Quantize ``names`` (the MatMuls of one layer, in graph order), their
        statistics at hand; one progress line."""
        start = time.perf_counter()
        if self.head_pending and self.head_name in names:
            self._decide_head()
            names = [n for n in names if n in self.choices]
        awq = self._awq_layer(names)
        awq.update(self._gptq_groups(names))
        for name in names:
            choice = self.choices[name]
            quantized = awq.pop(name, None)
            if quantized is None and name == self.head_name and self.head_quantized is not None:
                quantized = self.head_quantized
            if quantized is None:
                node = self.nodes[name]
                quantized = _quantize(
                    _weight(self.src, node), choice, self.stats.get(node.input[0]), self.options
                )
            self._write(name, quantized)
            if name == self.head_name:
                self.head_quantized = None
            entry = {**choice.to_json()}
            self.report["layers"][name] = {**self.report["layers"].get(name, {}), **entry}
            log.debug(
                "weight-only %s: %s int%d block %d",
                name,
                choice.algorithm,
                choice.bits,
                choice.block_size,
            )
        if names:
            kinds = sorted({f"{c.algorithm} int{c.bits}" for n in names for c in [self.choices[n]]})
            log.info(
                "weight-only %s: %d MatMul(s) %s (calibration %.1f s, quantization %.1f s)",
                label,
                len(names),
                ", ".join(kinds),
                calib_s,
                time.perf_counter() - start,
            )

    def _write(self, name: str, quantized: BlockQuantized) -> None:
        node = next(n for n in self.out.graph.node if n.name == name)
        fixed = _fixed_level(self.options)
        new = replace_matmul(self.out, node, quantized, fixed if fixed is not None else 0)
        self.written[new.name] = quantized.bits
        self.out_inits.update(i for i in new.input[1:] if i)

    def _decide_head(self) -> None:
        """``lm_head=auto`` with data: int8 when it costs little next-token agreement on
        the calibration windows, else float; the numbers go into the report."""
        assert self.head is not None
        self.head_pending = False
        name, entry = self.head.name, self.report["lm_head"]
        found = self.stats.get(self.head_input) if self.head_input is not None else None
        if found is None or not found.rows:
            del self.choices[name]
            entry.update(kept="fp32", reason="auto: no hidden states to measure the int8 head on")
            return
        weight = _weight(self.src, self.nodes[name])
        choice = self.choices[name]
        self.head_quantized = emb.rtn_by_columns(weight, 8, choice.block_size, choice.symmetric)
        measured = measure_lm_head(weight, found.sample(), self.head_quantized, self.options)
        del weight
        keep = measured.pop("int8")
        entry["measured"] = measured
        if keep:
            entry.update(kept="int8", reason="auto: int8 keeps next-token agreement (measured)")
        else:
            del self.choices[name]
            self.head_quantized = None
            entry.update(kept="fp32", reason="auto: int8 costs next-token agreement (measured)")
        log.info("lm_head %s: %s (%s)", name, entry["kept"], measured)

    def _gptq_groups(self, names: list[str]) -> dict[str, BlockQuantized]:
        """GPTQ of MatMuls sharing an input (gate/up), bits, block and scheme in one call
        on their concatenated weights: GPTQ treats output columns independently given
        the input Hessian, so the codes are the same, for one factorization."""
        groups: dict[tuple[str, int, int, bool], list[str]] = {}
        for name in names:
            choice, tensor = self.choices[name], self.nodes[name].input[0]
            found = self.stats.get(tensor)
            if choice.algorithm == "gptq" and found is not None and found.hessian is not None:
                group = (tensor, choice.bits, choice.block_size, choice.symmetric)
                groups.setdefault(group, []).append(name)
        results: dict[str, BlockQuantized] = {}
        for key, members in groups.items():
            if len(members) < 2:
                continue
            mats = [_weight(self.src, self.nodes[name]) for name in members]
            joined = _quantize(
                np.concatenate(mats, axis=1),
                self.choices[members[0]],
                self.stats[key[0]],
                self.options,
            )
            results.update(_split(joined, members, [m.shape[1] for m in mats]))
        return results

    # ------------------------------------------------------------------- AWQ
    def _awq_sites(self) -> dict[str, FoldSite]:
        """Foldable AWQ groups by input tensor (on the untouched graph); MatMuls of
        unfoldable groups switch to RTN, with the reason in the report."""
        sites: dict[str, FoldSite] = {}
        for tensor, members in _awq_groups(self.src, self.choices).items():
            site = fold_site(self.src, tensor, members, set(self.choices))
            if isinstance(site, str):
                for name in members:
                    self.report["awq_skipped"][name] = site
                    self.choices[name] = replace(self.choices[name], algorithm="rtn")
                    log.info("AWQ skipped for %s: %s; using RTN", name, site)
                continue
            sites[tensor] = site
        return sites

    def _awq_layer(self, names: list[str]) -> dict[str, BlockQuantized]:
        """AWQ for the groups whose members are all in ``names``: weights concatenated,
        one ``s``, folded into the output model."""
        results: dict[str, BlockQuantized] = {}
        here = set(names)
        for tensor, site in list(self.sites.items()):
            if not set(site.awq) <= here:
                continue
            del self.sites[tensor]
            results.update(self._awq_group(site, self.stats[tensor]))
        return results

    def _awq_group(self, site: FoldSite, stats: TensorStats) -> dict[str, BlockQuantized]:
        mats = [_weight(self.src, self.nodes[name]) for name in site.awq]
        first = self.choices[site.awq[0]]
        result = awq_search(
            np.concatenate(mats, axis=1),
            stats.sample(),
            first.bits,
            first.block_size,
            first.symmetric,
            n_grid=int(self.options.get("awq_grid", 20)),
        )
        needed = [*site.divide, *(self.nodes[f].input[1] for f in site.floats)]
        self._ensure(needed)
        apply_fold(self.out, site, result.scales)
        for name in site.awq:
            self.report["layers"][name] = {"awq_alpha": result.alpha, "awq_group": list(site.awq)}
        return _split(result.quantized, list(site.awq), [m.shape[1] for m in mats])

    # ------------------------------------------------------------- embedding
    def _embedding_streams(self) -> dict[str, Any]:
        """The streams that measure the embedding (``auto``): float, int4 and int8."""
        if self.embedding_choice != "auto" or self.embedding is None or self.head is None:
            return {}
        if any(emb.fits(self.embedding, block) for block, _ in self.formats.values()):
            return {}
        streams: dict[str, Any] = {REFERENCE: None}
        for bits in (4, 8):
            streams[f"int{bits}"] = self._table_rows(bits)
        return streams

    def _table(self, bits: int) -> BlockQuantized:
        """The embedding table quantized to ``bits`` (once per pass)."""
        assert self.embedding is not None
        if bits not in self.tables:
            block, symmetric = self.formats[bits]
            table = weights.array(self.inits[self.embedding.table])
            self.tables[bits] = emb.quantize_table(table, bits, block, symmetric)
        return self.tables[bits]

    def _table_rows(self, bits: int) -> Any:
        """A stream's embedding rows, its table quantized when a batch first needs it
        (never, when the calibration is read back from this run's files)."""

        def rows(ids: np.ndarray) -> np.ndarray:
            return emb.rows(self._table(bits))(ids)

        return rows

    def _embedding_format(self, bits: int) -> tuple[int, bool]:
        """Block size and scheme of a ``bits`` embedding: a tied quantized head's when
        its bits match (so the codes can be shared), else 32 symmetric."""
        head = self.choices.get(self.head_name or "")
        tied = self.head is not None and self.head.tied and self.head.table is not None
        if tied and head is not None and head.bits == bits:
            return head.block_size, head.symmetric
        return emb.BLOCK, True

    def _head_input_stage(self, stages: list[Stage]) -> tuple[str, int] | None:
        """lm_head's input tensor and the stage that makes it: where the embedding
        streams are compared (logits computed in numpy on a few hundred rows)."""
        if self.head is None:
            return None
        node = self.nodes[self.head.name]
        for index, stage in enumerate(stages):
            if node.input[0] in {out for n in stage.nodes for out in n.output}:
                return node.input[0], index
        return None

    def _finish_embedding(self) -> None:
        """Decide (``auto``) and write the embedding; report why."""
        entry: dict[str, Any] = {"requested": self.embedding_choice}
        self.report["embedding"] = entry
        if self.embedding is None:
            entry.update(kept="fp32", reason="no Gather over a constant table")
            return
        entry["name"] = self.embedding.node
        kind = self.embedding_choice
        if kind == "auto":
            need = float(self.options.get("lm_head_min_agreement", LM_HEAD_MIN_AGREEMENT))
            most = float(self.options.get("lm_head_max_kl", LM_HEAD_MAX_KL))
            measured = {
                k: {
                    "top1_agreement": round(v["top1"] / max(v["rows"], 1), 5),
                    "mean_kl": round(v["kl"] / max(v["rows"], 1), 6),
                    "rows": int(v["rows"]),
                }
                for k, v in self.compared.items()
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
        quantized = self._table(bits)
        self.tables.clear()
        shared = self._shared_head_b(quantized)
        rank = _input_rank(self.src, self.nodes[self.embedding.node].input[1])
        made = emb.write(self.out, self.embedding, quantized, shared, rank)
        self.out_inits.update(made)
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
        from .nodes import node_name

        return node_name(head.name, quantized.bits) + "_B"

    # ------------------------------------------------------------------ finish
    def _finish(self) -> None:
        self._finish_embedding()
        self._set_levels()
        head = self.head
        gathered = self.report.get("embedding", {}).get("kept", "fp32") == "fp32"
        float_head = head is not None and head.tied and head.name not in self.choices
        if float_head and gathered and head is not None and head.table:
            share_tied_table(self.out, head.name, head.table)
        self._fill_initializers()
        _write_report(self.out, self.report)

    def _set_levels(self) -> None:
        """``accuracy_level`` of every MatMulNBits written: the option, or measured."""
        if _fixed_level(self.options) is None:
            _measure_levels(
                self.src, self.choices, self.head_name, self.stats, self.options, self.report
            )
        by_bits = {bits: _level(bits, self.options, self.report) for bits in {8, 4}}
        written = set(self.written)
        for node in self.out.graph.node:
            if node.name not in written:
                continue
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = by_bits[self.written[node.name]]
        for name, layer in self.report["layers"].items():
            if name in self.choices:
                layer["accuracy_level"] = by_bits[self.choices[name].bits]

    def _ensure(self, names: Iterable[str]) -> None:
        """Copy the float initializers ``names`` into the output model (once)."""
        for name in names:
            if name in self.inits and name not in self.out_inits:
                self.out.graph.initializer.append(self.inits[name])
                self.out_inits.add(name)

    def _fill_initializers(self) -> None:
        """Copy every float initializer the output model still reads (norm scales, the
        embedding table, float MatMul weights), in the input model's order."""
        read = {name for node in self.out.graph.node for name in node.input}
        read |= {value.name for value in self.out.graph.output}
        read -= {name for node in self.out.graph.node for name in node.output}
        self._ensure(init.name for init in self.src.graph.initializer if init.name in read)

    def _level_inputs(self) -> set[str]:
        """Input tensors of the MatMuls ``accuracy_level`` is timed on (their statistics
        are kept to the end)."""
        if _fixed_level(self.options) is not None:
            return set()
        shapes = _shapes(self.src)
        exclude = {self.head_name} if self.head_name else set()
        found = set()
        for bits in {c.bits for c in self.choices.values()}:
            mine = {n for n, c in self.choices.items() if c.bits == bits}
            name = levels.representative(shapes, exclude, mine)
            if name is not None:
                found.add(self.nodes[name].input[0])
        return found


def _accumulate(
    found: Mapping[str, dict[str, float]],
    reference: np.ndarray,
    hidden: Mapping[str, np.ndarray],
    head: np.ndarray,
) -> None:
    """Add top-1 agreement and KL of each stream's logits ``hidden[name] @ head`` against
    ``reference @ head`` to ``found[name]``, 64 rows at a time (a whole batch of LLM
    logits is 100 MB; the reference's are computed once for all streams)."""
    ref = reference.reshape(-1, reference.shape[-1])
    flat = {name: value.reshape(-1, value.shape[-1]) for name, value in hidden.items()}
    for start in range(0, len(ref), 64):
        expected = ref[start : start + 64] @ head
        for name, got in flat.items():
            compare_logits(found[name], expected, got[start : start + 64] @ head)


def _split(q: BlockQuantized, names: list[str], widths: list[int]) -> dict[str, BlockQuantized]:
    """A weight quantized as the concatenation of ``names``' weights (along N), cut back."""
    out, start = {}, 0
    for name, width in zip(names, widths):
        stop = start + width
        out[name] = BlockQuantized(
            np.ascontiguousarray(q.codes[:, start:stop]),
            np.ascontiguousarray(q.scales[:, start:stop]),
            np.ascontiguousarray(q.zero_points[:, start:stop]),
            q.bits,
            q.block_size,
            q.symmetric,
        )
        start = stop
    return out


def _batches_for(feeds: list[dict[str, np.ndarray]], rows: int) -> int:
    """How many leading batches hold at least ``rows`` tokens (all when fewer)."""
    total = 0
    for index, feed in enumerate(feeds, 1):
        ids = next(iter(feed.values()))
        total += int(np.prod(ids.shape[:2])) if ids.ndim >= 2 else int(ids.size)
        if total >= rows:
            return index
    return len(feeds)


def _layer_groups(
    model: onnx.ModelProto, choices: Mapping[str, LayerChoice], stages: list[Stage] | None
) -> list[tuple[str, list[str]]]:
    """The MatMuls to quantize grouped by layer, in graph order (for progress lines)."""
    groups: list[tuple[str, list[str]]] = []
    if stages is not None:
        for stage in stages:
            names = [n.name for n in stage.nodes if n.name in choices]
            if names:
                groups.append((stage.label, names))
    else:
        for node in model.graph.node:
            if node.name not in choices:
                continue
            key = layer_of(node.name)
            label = f"layer {key}" if key is not None else "other"
            if groups and groups[-1][0] == label:
                groups[-1][1].append(node.name)
            else:
                groups.append((label, [node.name]))
    total = len(groups)
    return [(f"{label} ({i}/{total})", names) for i, (label, names) in enumerate(groups, 1)]


def _input_rank(model: onnx.ModelProto, name: str) -> int | None:
    for value in [*model.graph.input, *model.graph.value_info]:
        if value.name == name and value.type.tensor_type.HasField("shape"):
            return len(value.type.tensor_type.shape.dim)
    return None


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    inits = {init.name: init for init in model.graph.initializer}
    return {
        node.name: (int(inits[node.input[1]].dims[0]), int(inits[node.input[1]].dims[1]))
        for node in model.graph.node
        if node.op_type == "MatMul"
        and len(node.input) > 1
        and node.input[1] in inits
        and len(inits[node.input[1]].dims) == 2
    }


def share_tied_table(model: onnx.ModelProto, head: str, table: str) -> bool:
    """A float tied ``lm_head``: the embedding ``table`` (a separate initializer equal to
    the head's weight transposed, as ORT's constant folding leaves the builder's
    ``Transpose(lm_head weight)``) becomes that Transpose again, so the file holds the
    table once. The table initializer is dropped when ``model`` has it. Returns whether
    it changed the model."""
    import onnx

    node = next((n for n in model.graph.node if n.name == head), None)
    if node is None or node.op_type != "MatMul":
        return False
    for init in model.graph.initializer:
        if init.name == table:
            model.graph.initializer.remove(init)
            break
    transpose = onnx.helper.make_node(
        "Transpose", [node.input[1]], [table], name=f"{table}__lpq_tied", perm=[1, 0]
    )
    model.graph.node.insert(0, transpose)
    return True


def _weight(model: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    for init in model.graph.initializer:
        if init.name == node.input[1]:
            return np.asarray(weights.array(init), dtype=np.float32)
    raise ConfigError(
        f"MatMul {node.name!r} has no constant weight to quantize",
        hint="keep it fp32 (weight-only quantization needs an initializer as input B)",
    )


def _rows_of(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    """K of a MatMul's constant weight, from its header (no data read)."""
    for init in model.graph.initializer:
        if init.name == node.input[1]:
            return int(init.dims[0])
    raise ConfigError(
        f"MatMul {node.name!r} has no constant weight to quantize",
        hint="keep it fp32 (weight-only quantization needs an initializer as input B)",
    )


def _needs(
    model: onnx.ModelProto,
    choices: Mapping[str, LayerChoice],
    options: Mapping[str, Any],
    head_input: str | None = None,
) -> dict[str, Need]:
    """What each MatMul input tensor must be summarised into, merged over its readers
    (and ``lm_head``'s input rows, when its precision is to be measured)."""
    rows = int(options.get("awq_tokens", 512))
    needs: dict[str, Need] = {}
    if head_input is not None:
        width = next(
            _rows_of(model, n)
            for n in model.graph.node
            if n.input[:1] == [head_input] and n.op_type == "MatMul"
        )
        needs[head_input] = Need(width, sample_rows=HEAD_ROWS)
    for node in model.graph.node:
        choice = choices.get(node.name)
        if choice is None or choice.algorithm == "rtn":
            continue
        k = _rows_of(model, node)
        old = needs.get(node.input[0], Need(k))
        if node.input[0] == head_input:
            old = Need(k, sample_rows=max(HEAD_ROWS, old.sample_rows))
        needs[node.input[0]] = Need(
            k,
            hessian=old.hessian or choice.algorithm == "gptq",
            sample_rows=max(old.sample_rows, rows if choice.algorithm == "awq" else 0),
        )
    return needs


def _quantize(
    weight: np.ndarray, choice: LayerChoice, stats: TensorStats | None, options: Mapping[str, Any]
) -> BlockQuantized:
    """``weight`` quantized as ``choice`` says, from the run cache when an earlier trial
    of the run quantized it the same way (:mod:`.reuse`)."""
    return reuse.quantized(
        weight, choice, stats, options, lambda: _compute(weight, choice, stats, options)
    )


def _compute(
    weight: np.ndarray, choice: LayerChoice, stats: TensorStats | None, options: Mapping[str, Any]
) -> BlockQuantized:
    args = (weight, choice.bits, choice.block_size, choice.symmetric)
    if choice.algorithm == "gptq" and stats is not None and stats.hessian is not None:
        return gptq_quantize(
            weight,
            stats.hessian.hessian,
            choice.bits,
            choice.block_size,
            choice.symmetric,
            damp_percent=float(options.get("gptq_damp", 0.01)),
            act_order=str(options.get("gptq_act_order", False)).lower() in ("true", "1", "yes"),
            # errors pushed every block: the same algebra as 128, 1.5-4x faster in numpy
            update_block=choice.block_size,
        ).quantized
    if choice.algorithm == "scale_search":
        importance = stats.importance() if stats is not None else None
        return search_scales(*args, importance=importance)
    return quantize_rtn(*args)


def _awq_groups(
    model: onnx.ModelProto, choices: Mapping[str, LayerChoice]
) -> dict[str, dict[str, tuple[object, ...]]]:
    """AWQ MatMuls grouped by input tensor, each with its (bits, block, scheme) key."""
    groups: dict[str, dict[str, tuple[object, ...]]] = {}
    for node in model.graph.node:
        choice = choices.get(node.name)
        if choice is not None and choice.algorithm == "awq":
            key = (choice.bits, choice.block_size, choice.symmetric)
            groups.setdefault(node.input[0], {})[node.name] = key
    return groups


def _fixed_level(options: Mapping[str, Any]) -> int | None:
    """The ``accuracy_level`` option as an int, or None for ``auto``."""
    value = options.get("accuracy_level", "auto")
    if value in (None, "auto"):
        return None
    level = int(value)
    if not 0 <= level <= 4:
        raise ConfigError(f"accuracy_level must be 0..4 or auto, got {value!r}", hint="use auto")
    return level


def _measure_levels(
    model: onnx.ModelProto,
    choices: Mapping[str, LayerChoice],
    head: str | None,
    stats: Mapping[str, TensorStats],
    options: Mapping[str, Any],
    report: dict[str, Any],
) -> None:
    """``accuracy_level`` per bit width (``auto``), timed on a representative decoder
    MatMul (:func:`.accuracy_level.representative`: never lm_head or a Gather, capped in
    size) quantized RTN with that bit width's block and scheme; results in ``report``."""
    nodes = {node.name: node for node in model.graph.node}
    shapes = _shapes(model)
    exclude = {head} if head is not None else set()
    for bits in sorted({c.bits for c in choices.values()}):
        mine = {name for name, c in choices.items() if c.bits == bits}
        first = choices[next(name for name in choices if name in mine)]
        name = levels.representative(shapes, exclude, mine)
        if name is None:  # only the head: a column slice of it
            name = next(iter(mine))
            if name not in shapes:
                continue
        node = nodes[name]
        weight = _weight(model, node)
        cols = max(1, levels.MAX_TIMED_WEIGHTS // weight.shape[0])
        weight = np.ascontiguousarray(weight[:, :cols])
        quantized = quantize_rtn(weight, bits, first.block_size, first.symmetric)
        found = stats.get(node.input[0])
        sample = found.sample() if found is not None and found.rows else None
        result = levels.measure(weight, quantized, sample)
        report["accuracy_level"][f"int{bits}"] = {**result, "layer": name}


def _level(bits: int, options: Mapping[str, Any], report: dict[str, Any]) -> int:
    """``accuracy_level`` for a layer of ``bits``: the option, or the measured one."""
    fixed = _fixed_level(options)
    if fixed is not None:
        return fixed
    return int(report["accuracy_level"].get(f"int{bits}", {}).get("chosen", 0))


def _write_report(model: onnx.ModelProto, report: Mapping[str, Any]) -> None:
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(report, default=str)


def read_report(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The pass's report from a quantized model's ``metadata_props`` (None if absent)."""
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            return dict(json.loads(prop.value))
    return None
