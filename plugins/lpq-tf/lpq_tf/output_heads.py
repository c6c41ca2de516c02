"""The ops that compute a model's outputs stay fp32 in lpq-tf's static int8 plans.

An int8 op writes its whole output tensor at one scale, set by the widest values the
calibration saw. A detector's head writes one value per anchor, and most anchors are far
from anything: MediaPipe's pose detector writes person logits in [-523, 3] on its
calibration pictures, so an int8 head writes them at a step of 2.1, and every score near
MediaPipe's threshold of 0.5 (logit 0) reads either 0 or 2.1. Its box regressions span
[-804, 810] at a step of 6.3, with half of them within 11 of zero. The graph's outputs are
float anyway (``io_dtype`` float32: a DEQUANTIZE follows), so computing these ops in fp32
costs only their own arithmetic, a small share of a model.

Measured (``lpq quantize`` defaults, 100 held-out pictures, detection F1 over anchors
against fp32 at score 0.25 / 0.5 / 0.75):

* MediaPipe pose detector: 0.776 / 0.559 / 0.652 at 2.34x -> 0.885 / 0.860 / 0.841 at
  2.37x fp32 speed;
* MediaPipe BlazeFace: 0.792 / 0.917 / 0.973 at 1.50x -> 0.840 / 0.927 / 0.968 at 1.56x.

The rule is for outputs assembled from per-location values, as detector and dense
prediction heads are: an output written by an op that only moves values
(:data:`MOVING_OPS`: RESHAPE, CONCATENATION, ...). From it the walk goes back through
such ops to the first op that computes on each path; those ops and the moving ops on the
way stay fp32. An output one op computes straight into (a classifier's logits Dense)
keeps int8, as before: the rule was measured on detector heads, where it pays. Nothing
is kept where it would leave no op quantized, in 16x8 plans (65536 levels), nor where
the user asked for int8 graph outputs (``io_dtype`` int8). The option
``float_output_ops`` (default true) turns the rule off with ``false``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lpq import OpConfig

if TYPE_CHECKING:
    from .model_io import Prepared

#: The tune_cfg option that turns the rule off (``false``).
OPTION = "float_output_ops"
#: TFLite op types that only move, cut or join values: the walk back from an output goes
#: through them to the op that computes it.
MOVING_OPS = frozenset(
    {
        "CONCATENATION",
        "DEPTH_TO_SPACE",
        "DEQUANTIZE",
        "EXPAND_DIMS",
        "GATHER",
        "PACK",
        "PAD",
        "PADV2",
        "QUANTIZE",
        "RESHAPE",
        "SLICE",
        "SPACE_TO_DEPTH",
        "SPLIT",
        "SPLIT_V",
        "SQUEEZE",
        "STRIDED_SLICE",
        "TRANSPOSE",
        "UNPACK",
    }
)


@dataclass(frozen=True)
class OutputHead:
    """The quantized ops that compute (or move) the values of one model output."""

    output: str
    ops: tuple[str, ...]

    def describe(self) -> str:
        shown = ", ".join(self.ops[:4]) + (
            f" and {len(self.ops) - 4} more" if len(self.ops) > 4 else ""
        )
        return (
            f"{len(self.ops)} op(s) that compute model output {self.output} ({shown}): the "
            "output is float, and int8 would write all its values at one step "
            "(--option float_output_ops=false quantizes them)"
        )


def output_heads(
    prepared: Prepared, configs: Mapping[str, OpConfig], options: Mapping[str, Any]
) -> list[OutputHead]:
    """The quantized ops of ``configs`` that compute each model output; none when the
    option is off, outputs are int8, or they are every quantized op."""
    if not options.get(OPTION, True) or options.get("io_dtype", "float32") == "int8":
        return []
    graph = prepared.graph
    producers = graph.producers()
    claimed: set[int] = set()  # an op that feeds two outputs is named under the first
    heads = []
    for output in graph.outputs:
        last = producers.get(output)
        if last is None or last.op_type not in MOVING_OPS:
            continue  # computed by one op straight into the output: its values' own range
        waiting = [last]
        found: set[int] = set()
        while waiting:
            op = waiting.pop()
            if op.index in found or op.index in claimed:
                continue
            found.add(op.index)
            if op.op_type in MOVING_OPS:
                waiting += [
                    producers[t]
                    for t in op.inputs
                    if t in producers and graph.tensors[t].buffer is None  # activations
                ]
        claimed |= found
        names = tuple(
            prepared.names[index]
            for index in sorted(found)
            if index in prepared.names and _quantized(configs.get(prepared.names[index]))
        )
        if names:
            heads.append(OutputHead(graph.tensors[output].name, names))
    quantized = sum(_quantized(cfg) for cfg in configs.values())
    return heads if sum(len(head.ops) for head in heads) < quantized else []


def _quantized(cfg: OpConfig | None) -> bool:
    """Static with 8-bit activations (16x8 keeps 65536 levels)."""
    if cfg is None or not cfg.quantized or cfg.mode != "static":
        return False
    return cfg.activation is None or cfg.activation.dtype == "int8"
