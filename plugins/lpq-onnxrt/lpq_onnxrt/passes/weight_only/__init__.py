"""The weight-only pass: block-quantized MatMul weights as ``MatMulNBits`` (4 or 8 bits).

Each MatMul of the tune_cfg is quantized with its own algorithm (:mod:`lpq.weight_only`:
RTN, GPTQ, AWQ or the scale search), written by lpq itself with integer zero points
(:mod:`.nodes`) and the ``accuracy_level`` measured fastest without costing accuracy
(:mod:`.accuracy_level`). GPTQ and AWQ calibrate on the MatMul inputs, streamed chunk by
chunk (:mod:`.activations`); AWQ scales are folded into the producing normalization
where that is safe (:mod:`.awq_fold`). ``lm_head`` (:mod:`.plan`) becomes int8 when that
costs little next-token agreement on the calibration windows, else stays float (a tied
float head reads the embedding table through a Transpose again: one table in the file).
What was done per layer is written to the model's ``metadata_props`` under
``lpq_weight_only`` (JSON) and logged, one line per layer.

Options (``tune_cfg.options`` / ``--option``): ``accuracy_level`` (``auto`` or 0..4),
``lm_head`` (``auto``, ``fp32``, ``int8``, ``tuned``; ``lm_head_min_agreement`` 0.99 and
``lm_head_max_kl`` 0.01 for ``auto``), ``gptq_damp`` (0.01),
``gptq_act_order`` (false), ``awq_grid`` (20), ``awq_tokens`` (512 rows per layer),
``calib_budget_mb`` (512: activations held per calibration chunk).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, OpConfig
from lpq.weight_only import BlockQuantized, awq_search, gptq_quantize, quantize_rtn, search_scales

from . import accuracy_level as levels
from .activations import Need, TensorStats, collect
from .awq_fold import FoldSite, apply_fold, fold_site
from .nodes import replace_matmul
from .plan import (
    CALIBRATED,
    LayerChoice,
    decide_lm_head,
    find_lm_head,
    measure_lm_head,
    read_choices,
)

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

METADATA_KEY = "lpq_weight_only"
#: Rows of lm_head's input kept to measure an int8 head (``lm_head=auto``).
HEAD_ROWS = 256

__all__ = ["METADATA_KEY", "weight_only_pass"]


def weight_only_pass(
    model: onnx.ModelProto,
    ops: Mapping[str, OpConfig],
    options: Mapping[str, Any],
    calib_dataloader: Iterable[Any] | None = None,
) -> onnx.ModelProto:
    """``model`` (modified in place and returned) with ``ops`` as MatMulNBits."""
    nodes = {node.name: node for node in model.graph.node}
    choices = read_choices(ops, {name: nodes[name].op_type for name in ops if name in nodes})
    report: dict[str, Any] = {"layers": {}, "awq_skipped": {}, "accuracy_level": {}}
    head = find_lm_head(model)
    report["lm_head"] = decide_lm_head(
        choices, head, options.get("lm_head"), measurable=calib_dataloader is not None
    )
    pending = head is not None and (report["lm_head"] or {}).get("kept") == "measure"
    head_input = _input_of(model, head.name) if pending and head is not None else None
    stats = _calibrate(model, choices, calib_dataloader, options, head_input)
    if pending and head is not None:
        _decide_measured_head(model, head.name, head_input, choices, stats, options, report)
    awq = _run_awq(model, choices, stats, options, report)
    _measure_levels(model, choices, head.name if head is not None else None, stats, options, report)
    for index, (name, choice) in enumerate(choices.items(), 1):
        node = next(n for n in model.graph.node if n.name == name)
        weight = _weight(model, node)
        quantized = awq.pop(name, None)
        if quantized is None:
            quantized = _quantize(weight, choice, stats.get(node.input[0]), options)
        level = _level(quantized.bits, options, report)
        replace_matmul(model, node, quantized, level)
        entry = {**choice.to_json(), "accuracy_level": level}
        report["layers"][name] = {**report["layers"].get(name, {}), **entry}
        log.info(
            "weight-only %d/%d %s: %s int%d block %d",
            index,
            len(choices),
            name,
            choice.algorithm,
            choice.bits,
            choice.block_size,
        )
    if head is not None and head.tied and head.table and head.name not in choices:
        share_tied_table(model, head.name, head.table)
    _write_report(model, report)
    return model


def _input_of(model: onnx.ModelProto, name: str) -> str:
    return next(node.input[0] for node in model.graph.node if node.name == name)


def _decide_measured_head(
    model: onnx.ModelProto,
    name: str,
    tensor: str | None,
    choices: dict[str, LayerChoice],
    stats: Mapping[str, TensorStats],
    options: Mapping[str, Any],
    report: dict[str, Any],
) -> None:
    """``lm_head=auto`` with data: int8 when it costs little next-token agreement on the
    calibration windows, else float; the numbers go into the report."""
    entry = report["lm_head"]
    found = stats.get(tensor) if tensor is not None else None
    if found is None or not found.rows:
        del choices[name]
        entry.update(kept="fp32", reason="auto: no hidden states to measure the int8 head on")
        return
    node = next(n for n in model.graph.node if n.name == name)
    measured = measure_lm_head(_weight(model, node), found.sample(), choices[name], options)
    keep = measured.pop("int8")
    entry["measured"] = measured
    if keep:
        entry.update(kept="int8", reason="auto: int8 keeps next-token agreement (measured)")
    else:
        del choices[name]
        entry.update(kept="fp32", reason="auto: int8 costs next-token agreement (measured)")
    log.info("lm_head %s: %s (%s)", name, entry["kept"], measured)


def share_tied_table(model: onnx.ModelProto, head: str, table: str) -> bool:
    """A float tied ``lm_head``: the embedding ``table`` (a separate initializer equal to
    the head's weight transposed, as ORT's constant folding leaves the builder's
    ``Transpose(lm_head weight)``) becomes that Transpose again, so the file holds the
    table once. Returns whether it changed the model."""
    import onnx

    node = next((n for n in model.graph.node if n.name == head), None)
    inits = [init for init in model.graph.initializer if init.name == table]
    if node is None or node.op_type != "MatMul" or not inits:
        return False
    weight = node.input[1]
    model.graph.initializer.remove(inits[0])
    transpose = onnx.helper.make_node(
        "Transpose", [weight], [table], name=f"{table}__lpq_tied", perm=[1, 0]
    )
    model.graph.node.insert(0, transpose)
    return True


def _weight(model: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.name == node.input[1]:
            return np.asarray(numpy_helper.to_array(init), dtype=np.float32)
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
            int(_weight(model, n).shape[0])
            for n in model.graph.node
            if n.input[:1] == [head_input] and n.op_type == "MatMul"
        )
        needs[head_input] = Need(width, sample_rows=HEAD_ROWS)
    for node in model.graph.node:
        choice = choices.get(node.name)
        if choice is None or choice.algorithm == "rtn":
            continue
        k = int(_weight(model, node).shape[0])
        old = needs.get(node.input[0], Need(k))
        if node.input[0] == head_input:
            old = Need(k, sample_rows=max(HEAD_ROWS, old.sample_rows))
        needs[node.input[0]] = Need(
            k,
            hessian=old.hessian or choice.algorithm == "gptq",
            sample_rows=max(old.sample_rows, rows if choice.algorithm == "awq" else 0),
        )
    return needs


def _calibrate(
    model: onnx.ModelProto,
    choices: Mapping[str, LayerChoice],
    calib: Iterable[Any] | None,
    options: Mapping[str, Any],
    head_input: str | None = None,
) -> dict[str, TensorStats]:
    calibrated = sorted({c.algorithm for c in choices.values() if c.algorithm in CALIBRATED})
    if calib is None:
        if calibrated:
            raise ConfigError(
                f"weight-only {', '.join(calibrated)} needs calibration data, and none was given",
                hint="pass token windows (CLI: --calib tokens.npz holding input_ids (N, L) int64), "
                "or use algorithm rtn / scale_search",
            )
        return {}
    needs = _needs(model, choices, options, head_input)
    if not needs:
        return {}
    budget = int(float(options.get("calib_budget_mb", 512)) * (1 << 20))
    return collect(model, calib, needs, budget_bytes=budget)


def _quantize(
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


def _run_awq(
    model: onnx.ModelProto,
    choices: dict[str, LayerChoice],
    stats: Mapping[str, TensorStats],
    options: Mapping[str, Any],
    report: dict[str, Any],
) -> dict[str, BlockQuantized]:
    """AWQ per foldable group (weights concatenated, one ``s``), folds applied; MatMuls
    of unfoldable groups switch to RTN, with the reason in ``report``."""
    results: dict[str, BlockQuantized] = {}
    for tensor, members in _awq_groups(model, choices).items():
        site = fold_site(model, tensor, members, set(choices))
        if isinstance(site, str):
            for name in members:
                report["awq_skipped"][name] = site
                choices[name] = replace(choices[name], algorithm="rtn")
                log.info("AWQ skipped for %s: %s; using RTN", name, site)
            continue
        results.update(_awq_group(model, site, choices, stats[tensor], options, report))
    return results


def _awq_group(
    model: onnx.ModelProto,
    site: FoldSite,
    choices: Mapping[str, LayerChoice],
    stats: TensorStats,
    options: Mapping[str, Any],
    report: dict[str, Any],
) -> dict[str, BlockQuantized]:
    nodes = {node.name: node for node in model.graph.node}
    weights = [_weight(model, nodes[name]) for name in site.awq]
    first = choices[site.awq[0]]
    result = awq_search(
        np.concatenate(weights, axis=1),
        stats.sample(),
        first.bits,
        first.block_size,
        first.symmetric,
        n_grid=int(options.get("awq_grid", 20)),
    )
    apply_fold(model, site, result.scales)
    q, out, start = result.quantized, {}, 0
    for name, weight in zip(site.awq, weights):
        stop = start + weight.shape[1]
        out[name] = BlockQuantized(
            np.ascontiguousarray(q.codes[:, start:stop]),
            np.ascontiguousarray(q.scales[:, start:stop]),
            np.ascontiguousarray(q.zero_points[:, start:stop]),
            q.bits,
            q.block_size,
            q.symmetric,
        )
        report["layers"][name] = {"awq_alpha": result.alpha, "awq_group": list(site.awq)}
        start = stop
    return out


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
    if _fixed_level(options) is not None:
        return
    from onnx import numpy_helper

    inits = {init.name: init for init in model.graph.initializer}
    nodes = {
        node.name: node
        for node in model.graph.node
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits
    }
    shapes = {
        name: (int(inits[n.input[1]].dims[0]), int(inits[n.input[1]].dims[1]))
        for name, n in nodes.items()
        if len(inits[n.input[1]].dims) == 2
    }
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
        weight = np.asarray(numpy_helper.to_array(inits[node.input[1]]), dtype=np.float32)
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
