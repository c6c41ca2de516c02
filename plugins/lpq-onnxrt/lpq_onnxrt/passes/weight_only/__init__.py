"""The weight-only pass: block-quantized MatMul weights as ``MatMulNBits`` (4 or 8 bits).

Each MatMul of the tune_cfg is quantized with its own algorithm (:mod:`lpq.weight_only`:
RTN, GPTQ, AWQ or the scale search), written by lpq itself with integer zero points
(:mod:`.nodes`) and the ``accuracy_level`` measured fastest without costing accuracy
(:mod:`.accuracy_level`). AWQ scales are folded into the producing normalization where
that is safe (:mod:`.awq`, :mod:`.awq_fold`). ``lm_head`` (:mod:`.lm_head`) becomes int8
when that costs little next-token agreement on the calibration windows, else stays float
(a tied float head reads the embedding table through a Transpose again: one table in the
file). The token embedding (:mod:`.embedding_choice`) becomes GatherBlockQuantized (int4
or int8) when the logits on the calibration windows say it costs nothing, or on request.

The pass's jobs, one module each:

* :mod:`.plan` -- the choice per MatMul from the tune_cfg, lm_head found and planned;
* :mod:`.calibrate` -- what each MatMul input must be summarised into, and the
  calibration run, one decoder layer (:mod:`.stages`) at a time;
* :mod:`.matmuls` -- quantizing a MatMul weight (RTN, GPTQ, scale search); :mod:`.awq`
  -- AWQ groups, searched and folded;
* :mod:`.lm_head`, :mod:`.embedding_choice` -- measured precisions of the head and the
  embedding;
* :mod:`.accuracy_level` -- MatMulNBits' ``accuracy_level``, measured;
* :mod:`.output` -- the model written and its report; :mod:`.source` -- reading the input;
* :mod:`.reuse` -- what the trials of one tuning run share (calibration statistics,
  quantized weights, the head's measurement), as files in the run's cache folder.

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

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lpq import ConfigError, OpConfig
from lpq.weight_only import BlockQuantized

from . import accuracy_level as levels
from . import matmuls, source
from .activations import TensorStats, collect
from .awq import Awq
from .calibrate import LayerwiseCalibration, needs
from .embedding_choice import EmbeddingChoice
from .lm_head import decide_head
from .output import METADATA_KEY, Output, read_report, share_tied_table, write_report
from .plan import CALIBRATED, decide_lm_head, find_lm_head, read_choices
from .stages import Stage, layer_of, plan_stages

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

__all__ = ["METADATA_KEY", "read_report", "share_tied_table", "weight_only_pass"]


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
    """One run of the pass: the choices, the report, and the jobs (module docstring)
    in order: calibrate a layer, quantize it, write it; then finish the model."""

    def __init__(
        self,
        model: onnx.ModelProto,
        ops: Mapping[str, OpConfig],
        options: Mapping[str, Any],
        calib: Iterable[Any] | None,
    ) -> None:
        self.src, self.options, self.calib = model, options, calib
        self.nodes = {node.name: node for node in model.graph.node}
        op_types = {name: self.nodes[name].op_type for name in ops if name in self.nodes}
        self.choices = read_choices(ops, op_types)
        self.report: dict[str, Any] = {"layers": {}, "awq_skipped": {}, "accuracy_level": {}}
        self.head = find_lm_head(model)
        self.head_name = self.head.name if self.head is not None else None
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
        self.embedding = EmbeddingChoice(model, self.head, self.choices, options, measurable)
        self.out = Output(model)
        self.head_quantized: BlockQuantized | None = None
        self.stats: dict[str, TensorStats] = {}
        self.compared: Mapping[str, Mapping[str, float]] = {}

    def run(self) -> onnx.ModelProto:
        self._check_calibration()
        wanted = needs(self.src, self.choices, self.options, self.head_input)
        self.awq = Awq(self.src, self.choices, self.options, self.report)
        keep = levels.level_inputs(self.src, self.choices, self.head_name, self.options)
        stages = plan_stages(self.src)
        streams = self.embedding.streams() if stages is not None else {}
        if (wanted or len(streams) > 1) and stages is not None:
            assert self.calib is not None
            calibration = LayerwiseCalibration(
                self.src,
                self.calib,
                self.choices,
                self.head_name,
                wanted,
                keep,
                streams,
                self.embedding.formats,
            )
            self.stats = calibration.stats  # the same dict, filled and emptied by the run
            layers = sum(1 for s in stages if not s.gather)
            done = 0
            for stage, calib_s in calibration.run(stages):
                names = [n.name for n in stage.nodes if n.name in self.choices]
                done += not stage.gather
                if names or self.head_name in stage.names:
                    self._quantize_layer(f"{stage.label} ({done}/{layers})", names, calib_s)
            self.compared = calibration.compared
        else:
            if wanted:
                budget = int(float(self.options.get("calib_budget_mb", 512)) * (1 << 20))
                assert self.calib is not None
                self.stats = collect(self.src, self.calib, wanted, budget_bytes=budget)
            for label, names in _layer_groups(self.src, self.choices, stages):
                self._quantize_layer(label, names)
        self._finish()
        return self.out.model

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

    def _quantize_layer(self, label: str, names: list[str], calib_s: float = 0.0) -> None:
        """Quantize ``names`` (the MatMuls of one layer, in graph order), their
        statistics at hand, and write them; one progress line."""
        start = time.perf_counter()
        if self.head_pending and self.head_name in names:
            self.head_pending = False
            assert self.head is not None and self.head_input is not None
            self.head_quantized = decide_head(
                self.src,
                self.nodes[self.head.name],
                self.choices,
                self.report["lm_head"],
                self.stats.get(self.head_input),
                self.options,
            )
            names = [n for n in names if n in self.choices]
        done = self.awq.layer(names, self.stats, self.out)
        done.update(
            matmuls.gptq_groups(self.src, self.nodes, names, self.choices, self.stats, self.options)
        )
        fixed = levels.fixed_level(self.options)
        for name in names:
            choice = self.choices[name]
            quantized = done.pop(name, None)
            if quantized is None and name == self.head_name and self.head_quantized is not None:
                quantized = self.head_quantized
            if quantized is None:
                node = self.nodes[name]
                quantized = matmuls.quantize(
                    source.weight(self.src, node),
                    choice,
                    self.stats.get(node.input[0]),
                    self.options,
                )
            self.out.matmul(name, quantized, fixed if fixed is not None else 0)
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

    def _finish(self) -> None:
        """The embedding, ``accuracy_level``, a float tied head's shared table, the float
        initializers still read, and the report."""
        self.embedding.finish(self.out, self.report, self.compared)
        if levels.fixed_level(self.options) is None:
            levels.measure_levels(self.src, self.choices, self.head_name, self.stats, self.report)
        by_bits = {bits: levels.level(bits, self.options, self.report) for bits in (8, 4)}
        self.out.set_levels(by_bits)
        for name, layer in self.report["layers"].items():
            if name in self.choices:
                layer["accuracy_level"] = by_bits[self.choices[name].bits]
        head = self.head
        gathered = self.report.get("embedding", {}).get("kept", "fp32") == "fp32"
        float_head = head is not None and head.tied and head.name not in self.choices
        if float_head and gathered and head is not None and head.table:
            share_tied_table(self.out.model, head.name, head.table)
        self.out.fill_initializers()
        write_report(self.out.model, self.report)


def _layer_groups(
    model: onnx.ModelProto, choices: Mapping[str, Any], stages: list[Stage] | None
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
