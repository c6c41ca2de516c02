"""Quantizing MatMul weights: one algorithm per MatMul (RTN, GPTQ, the scale search),
GPTQ once for MatMuls that share an input, and the run's earlier results reused
(:mod:`.reuse`). AWQ, which also changes the graph, is :mod:`.awq`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq.weight_only import BlockQuantized, gptq_quantize, quantize_rtn, search_scales

from . import reuse, source
from .activations import TensorStats
from .plan import LayerChoice

if TYPE_CHECKING:
    import onnx


def quantize(
    weight: np.ndarray, choice: LayerChoice, stats: TensorStats | None, options: Mapping[str, Any]
) -> BlockQuantized:
    """``weight`` quantized as ``choice`` says, from the run's files when an earlier
    trial of the run quantized it the same way (:mod:`.reuse`)."""
    return reuse.quantized(
        weight, choice, stats, options, lambda: compute(weight, choice, stats, options)
    )


def compute(
    weight: np.ndarray, choice: LayerChoice, stats: TensorStats | None, options: Mapping[str, Any]
) -> BlockQuantized:
    """``weight`` quantized as ``choice`` says (GPTQ needs the Hessian, the scale search
    weights channels by their mean squares when it has them)."""
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


def split(q: BlockQuantized, names: list[str], widths: list[int]) -> dict[str, BlockQuantized]:
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


def gptq_groups(
    src: onnx.ModelProto,
    nodes: Mapping[str, onnx.NodeProto],
    names: list[str],
    choices: Mapping[str, LayerChoice],
    stats: Mapping[str, TensorStats],
    options: Mapping[str, Any],
) -> dict[str, BlockQuantized]:
    """GPTQ of MatMuls sharing an input (gate/up), bits, block and scheme in one call on
    their concatenated weights: GPTQ treats output columns independently given the input
    Hessian, so the codes are the same, for one factorization."""
    groups: dict[tuple[str, int, int, bool], list[str]] = {}
    for name in names:
        choice, tensor = choices[name], nodes[name].input[0]
        found = stats.get(tensor)
        if choice.algorithm == "gptq" and found is not None and found.hessian is not None:
            group = (tensor, choice.bits, choice.block_size, choice.symmetric)
            groups.setdefault(group, []).append(name)
    results: dict[str, BlockQuantized] = {}
    for key, members in groups.items():
        if len(members) < 2:
            continue
        mats = [source.weight(src, nodes[name]) for name in members]
        joined = quantize(np.concatenate(mats, axis=1), choices[members[0]], stats[key[0]], options)
        results.update(split(joined, members, [m.shape[1] for m in mats]))
    return results
