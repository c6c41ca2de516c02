"""The object ``lpq_quantize`` returns: a quantized ``.tflite`` plus what made it.

The tune_cfg, the quantizer used and the fp32 model's op list travel with the bytes, so
that ``lpq_save_model`` can store them as TFLite metadata and a saved model maps its ops
back to the fp32 names (for inspection and per-op precision) without the fp32 model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lpq import TuneConfig

if TYPE_CHECKING:
    from .calibration import Samples
    from .model_io import Prepared


@dataclass
class QuantizedModel:
    """A quantized (or partly fallen-back) LiteRT model and its provenance."""

    content: bytes
    tune_cfg: TuneConfig
    #: ``(lpq name, op type, TFLite output tensor name)`` of every op of the fp32 model.
    float_ops: list[tuple[str, str, str]]
    #: Which quantizer wrote it: "tflite-converter", "ai-edge-quantizer" or "float".
    backend: str
    #: lpq names of the ops the capability listed (those per-op precision is reported for).
    quantizable: list[str] = field(default_factory=list)
    #: Runtime settings for evaluation (``num_threads``) and the I/O dtype asked for.
    options: dict[str, Any] = field(default_factory=dict)
    #: The fp32 model it came from (not saved; absent after loading from a file).
    source: Prepared | None = field(default=None, repr=False, compare=False)
    #: The calibration samples used (not saved), so fp16 conversion can re-quantize.
    samples: Samples | None = field(default=None, repr=False, compare=False)
    #: Latency-aware decisions (:meth:`lpq.latency.Decision.to_json`: ops kept fp32, the
    #: measurements), when they ran (not saved).
    latency: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        quantized = len(self.tune_cfg.quantized_ops())
        return (
            f"QuantizedModel({len(self.content) / 1e6:.2f} MB .tflite by {self.backend}, "
            f"{quantized} of {len(self.float_ops)} ops asked quantized)"
        )


def resolved_config(model: Any) -> TuneConfig | None:
    """The ``lpq_resolved_config`` job: the tune_cfg the model really is. Ops the
    shared-scale, output-head, no-kernel and latency-aware steps kept fp32 are fallbacks
    in it, and ``latency_aware`` is off once decided, so quantizing with it again gives
    the same model without measuring anew."""
    return model.tune_cfg if isinstance(model, QuantizedModel) else None
