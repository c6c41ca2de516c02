"""``lm_head=auto`` with data: the head becomes int8 when that costs little next-token
agreement on the calibration windows (:func:`.plan.measure_lm_head`), else stays float."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lpq.weight_only import BlockQuantized

from . import embedding as emb
from . import reuse, source
from .activations import TensorStats
from .plan import LayerChoice, measure_lm_head

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)


def decide_head(
    src: onnx.ModelProto,
    node: onnx.NodeProto,
    choices: dict[str, LayerChoice],
    entry: dict[str, Any],
    found: TensorStats | None,
    options: Mapping[str, Any],
) -> BlockQuantized | None:
    """The int8 head's codes when int8 is kept, else None (the head leaves ``choices``:
    it stays float); ``entry`` (the report's ``lm_head``) gets the numbers and why.
    ``found``: the statistics of the head's input, with its sampled rows."""
    name = node.name
    if found is None or not found.rows:
        del choices[name]
        entry.update(kept="fp32", reason="auto: no hidden states to measure the int8 head on")
        return None
    weight = source.weight(src, node)
    choice = choices[name]
    quantized = emb.rtn_by_columns(weight, 8, choice.block_size, choice.symmetric)
    sample = found.sample()
    thresholds = {k: str(options.get(k)) for k in ("lm_head_min_agreement", "lm_head_max_kl")}
    measured = dict(
        reuse.remembered(
            "lm-head",
            [weight, sample, choice.block_size, choice.symmetric, thresholds],
            lambda: measure_lm_head(weight, sample, quantized, options),
        )
    )
    keep = measured.pop("int8")
    entry["measured"] = measured
    if keep:
        entry.update(kept="int8", reason="auto: int8 keeps next-token agreement (measured)")
    else:
        del choices[name]
        entry.update(kept="fp32", reason="auto: int8 costs next-token agreement (measured)")
    log.info("lm_head %s: %s (%s)", name, entry["kept"], measured)
    return quantized if keep else None
