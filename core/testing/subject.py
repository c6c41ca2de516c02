"""What a conformance check runs against: one adaptor, its sample model and data.

The checks are plain functions of a :class:`Subject`, so lpq's own tests can run them
against a plugin registered by hand (``lpq_plugin``) without a pytest subprocess, and
:class:`lpq.testing.AdaptorConformance` only wires its fixtures into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..eval.data import OutputRecorder, take_samples
from ..plan.capability import FrameworkCapability
from ..plan.tune_config import TuneConfig

#: Samples the suite calibrates on. Every check then scores *all* of ``lpq_sample_data``,
#: so the first 16 samples are both calibration and evaluation data.
CALIB_SAMPLES = 16


def default_tune_cfg(cap: FrameworkCapability, calib_samples: int = CALIB_SAMPLES) -> TuneConfig:
    """Every op at its capability's default config (what the tuner tries first)."""
    return TuneConfig(
        ops={key: cap.default_op_config(key) for key in cap.opwise},
        calib_sampling_size=calib_samples,
    )


@dataclass
class Subject:
    """An adaptor under test, reached only through the public plugin-manager facade."""

    pm: Any
    framework: str
    capability: FrameworkCapability
    model: Any
    data: Any

    def tune_cfg(self, calib_samples: int = CALIB_SAMPLES) -> TuneConfig:
        return default_tune_cfg(self.capability, calib_samples)

    def quantize(self, cfg: TuneConfig | None = None) -> Any:
        return self.pm.quantize(self.framework, self.model, cfg or self.tune_cfg(), self.data)

    def outputs(self, model: Any, data: Any = None) -> list[Any]:
        """``model``'s outputs, batch by batch, over ``data`` (default: the sample data)."""
        recorder = OutputRecorder()
        self.pm.evaluate(self.framework, model, self.data if data is None else data, [recorder])
        return recorder.outputs

    def calibration_batches(self, calib_samples: int = CALIB_SAMPLES) -> list[Any]:
        """The batches ``lpq.take_samples`` gives calibration: the sample data's first."""
        return list(take_samples(self.data, calib_samples))
