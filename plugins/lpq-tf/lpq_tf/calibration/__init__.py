"""Calibration for LiteRT: samples from the user's dataloader, ranges from TFLite's tools.

Both quantizers lpq drives record activation ranges (min/max) themselves: the TFLite
converter's calibrator (``_experimental_calibrate_only``, the step
``tf.lite.experimental.QuantizationDebugger`` also uses) and ai-edge-quantizer's. lpq
collects and checks the samples once, and caches the calibrated result per model, data
and sample count, so the trials of a tuning run calibrate once.
"""

from .calibrated import aeq_calibration, converter_calibrated
from .samples import Samples, collect

__all__ = ["Samples", "aeq_calibration", "collect", "converter_calibrated"]
