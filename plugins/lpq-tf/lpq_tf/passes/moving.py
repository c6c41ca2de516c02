"""Ops outside the tune_cfg (RESHAPE, PAD, ...) that only carry the float output of an op
kept fp32: both quantizers would quantize them."""

from __future__ import annotations

from collections.abc import Mapping

from lpq import OpConfig

from ..model_io import Prepared


def following_float(prepared: Prepared, by_tensor: Mapping[str, OpConfig]) -> list[str]:
    """Output tensors of the ops ``by_tensor`` does not name (data movement: RESHAPE, PAD,
    ...) whose every activation input comes from an op kept fp32, directly or through
    other such ops.

    ai-edge-quantizer's base recipe entry and the converter's selective quantization
    quantize them: a RESHAPE after a conv kept fp32 got a QUANTIZE before it, and
    ai-edge-quantizer then quantized the CONCATENATION it feeds although the recipe
    kept that fp32. MediaPipe's pose detector with its score head kept fp32 still
    wrote its logits at a step of 2.3 (they span [-576, 2.9]). Inputs of the graph
    count as quantized (the base entry's QUANTIZE at the input is what a quantized
    op after them needs)."""
    graph = prepared.graph
    producers = graph.producers()
    is_float: dict[int, bool] = {}  # op index -> runs in fp32
    found = []
    for op in graph.model_ops():
        name = graph.output_name(op)
        if name in by_tensor:
            is_float[op.index] = not by_tensor[name].quantized
            continue
        inputs = [t for t in op.inputs if t >= 0 and graph.tensors[t].buffer is None]
        sources = [producers.get(t) for t in inputs]
        follows = bool(sources) and all(
            source is not None and is_float.get(source.index, False) for source in sources
        )
        is_float[op.index] = follows
        if follows and name:
            found.append(name)
    return found
