"""What one trial measured, as plain JSON for the history file."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..plan.tune_config import TuneConfig


@dataclass
class TrialRecord:
    """Measurements of one trial (or of the fp32 baseline, index -1).

    ``index`` is the trial id: given when the trial is proposed, in proposal order, so
    it does not depend on which worker finishes first. ``quantized_ops`` and
    ``fallback_ops`` are read from the converted model when the adaptor can say
    (``counts_from == "model"``), else from the tune_cfg (``"plan"``).
    ``resolved_fingerprint``: the fingerprint of the tune_cfg the model really is, when the
    adaptor resolved choices the requested one left open (``lpq_resolved_config``); a
    later proposal of it is answered from this trial.
    """

    index: int
    fingerprint: str
    tune_cfg: dict[str, Any] | None
    stage: str = ""
    status: str = "ok"
    accuracy: float = math.nan
    latency_ms: float | None = None
    size_bytes: int | None = None
    footprint_bytes: int | None = None
    duration_s: float = 0.0
    meets_goal: bool = False
    error: str = ""
    traceback: str = ""
    quantized_ops: int = 0
    fallback_ops: int = 0
    counts_from: str = "plan"
    op_precisions: dict[str, str] | None = None
    resolved_fingerprint: str = ""
    resumed: bool = False
    attempts: int = 1
    worker: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if math.isnan(self.accuracy):
            data["accuracy"] = None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if known.get("accuracy") is None:
            known["accuracy"] = math.nan
        return cls(**known)

    def config(self) -> TuneConfig | None:
        return TuneConfig.from_json(self.tune_cfg) if self.tune_cfg is not None else None
