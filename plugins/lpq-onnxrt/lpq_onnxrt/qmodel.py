"""The object ``lpq_quantize`` returns: a quantized proto plus what made it.

Keeping the tune_cfg and the calibration ranges beside the proto lets ``lpq_save_model``
store them as ONNX metadata, so a saved model can be rebuilt or re-quantized later
without recalibrating, and lets inspection map quantized tensors back to fp32 node names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lpq import TuneConfig

if TYPE_CHECKING:
    import onnx


@dataclass
class QuantizedModel:
    """A quantized (or partly fallen-back) ONNX model and its provenance.

    ``ranges`` maps activation tensor names to the calibrated ``(min, max)`` used.
    ``fp32_outputs`` / ``fp32_weights`` map fp32 node names to tensor names, since ORT's
    QOperator format renames quantized nodes and tensors.
    ``options`` are session settings (threads, execution providers) for evaluation.
    """

    proto: onnx.ModelProto
    tune_cfg: TuneConfig
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    #: fp32 node name -> its first output tensor name in the fp32 model (for inspection).
    fp32_outputs: dict[str, str] = field(default_factory=dict)
    #: fp32 node name -> names of its float weight initializers in the fp32 model.
    fp32_weights: dict[str, list[str]] = field(default_factory=dict)
    #: latency-aware decisions (ops kept fp32, format, measurements), when it ran.
    latency: dict[str, Any] | None = None
    #: what the ``auto`` activation range algorithm resolved to, and why (output errors).
    range_choice: dict[str, Any] | None = None

    def __repr__(self) -> str:
        quantized = len(self.tune_cfg.quantized_ops())
        return (
            f"QuantizedModel({len(self.proto.graph.node)} nodes, {quantized} ops quantized, "
            f"{len(self.ranges)} calibrated tensors)"
        )


def resolved_config(model: Any) -> TuneConfig | None:
    """The ``lpq_resolved_config`` job: the tune_cfg the model really is, so that
    quantizing with it again gives the same model: ``auto`` range algorithms spelled out,
    the Concats the shared-scale rule kept fp32 as fallbacks and, after latency-aware
    decisions, the ops they kept fp32 or made dynamic, the format they chose
    (``quant_format``) and ``latency_aware`` off (nothing left to measure)."""
    if not isinstance(model, QuantizedModel):
        return None
    if model.latency is None:
        return model.tune_cfg
    return model.tune_cfg.with_options(
        {"quant_format": model.options["quant_format"], "latency_aware": False}
    )
