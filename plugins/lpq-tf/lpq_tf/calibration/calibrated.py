"""Calibrated models, computed once per (model, samples) and cached on the prepared model."""

from __future__ import annotations

import os
import warnings
from typing import Any

from lpq import ModelError

from ..model_io import Prepared, run_converter
from ..runtime import create_interpreter
from ..tfenv import captured_stderr, import_tf
from .samples import Samples


def converter_calibrated(prepared: Prepared, samples: Samples) -> bytes:
    """The float model with TFLite's calibrated min/max on every tensor.

    This is the converter's own calibration step (``_experimental_calibrate_only``, what
    ``tf.lite.experimental.QuantizationDebugger`` runs before it quantizes with
    denylisted nodes); the quantization itself is then cheap and done per trial.
    """
    key = ("converter-calibrated", samples.digest, len(samples))
    if key not in prepared.cache:
        tf = import_tf()
        assert prepared.saved_model_dir is not None

        def configure(converter: Any) -> None:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = samples.as_lists
            converter._experimental_calibrate_only = True

        prepared.cache[key] = run_converter(prepared.saved_model_dir, configure)
    result: bytes = prepared.cache[key]
    return result


def aeq_calibration(prepared: Prepared, samples: Samples) -> dict[str, Any]:
    """ai-edge-quantizer's per-tensor ranges for every tensor a static recipe can touch:
    the extremes of every value seen (lpq's ``minmax``, as the converter's calibration).

    ai-edge-quantizer's own ``calibrate`` keeps a moving average (0.95) of each sample's
    min and max instead. A value that only a few samples reach falls outside the range,
    and a detector's scores are such values: MediaPipe's BlazeFace saw face logits up to
    3.5 on 160 of its anchors over 48 calibration pictures, and its averaged range ended
    at -0.09. Every int8 face score then read below 0.5 (no face at MediaPipe's
    threshold). Its calibrator is used with its own ``min_max_update``.

    Calibrated once with an all-ops static recipe, so one result serves every trial's
    recipe (ranges do not depend on the bits or on which ops end up quantized).
    """
    key = ("aeq-calibration", samples.digest, len(samples))
    if key not in prepared.cache:
        from ai_edge_quantizer import qtyping, quantizer

        signatures = create_interpreter(prepared.float_tflite).get_signature_list()
        signature = next(iter(signatures), None)
        if signature is None:
            raise ModelError(
                f"{prepared.source}: the .tflite has no signature, which ai-edge-quantizer "
                "needs to calibrate",
                hint="re-convert the model from its SavedModel or Keras model with lpq",
            )
        names = [spec.signature_name or spec.name for spec in samples.specs]
        from ai_edge_quantizer import calibrator
        from ai_edge_quantizer.utils import qsv_utils

        tool = quantizer.Quantizer(prepared.float_tflite)
        tool.add_static_config(".*", qtyping.TFLOperationName.ALL_SUPPORTED, 8, 8)
        with captured_stderr(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # preserve_all_tensors "is for debugging"
            calib = calibrator.Calibrator(
                prepared.float_tflite,
                num_threads=os.cpu_count() or 1,
                qsv_update_func=qsv_utils.min_max_update,
            )
            calib.calibrate({signature: samples.as_signature_dicts(names)}, tool._recipe_manager)
            prepared.cache[key] = calib.get_model_qsvs()
    result: dict[str, Any] = prepared.cache[key]
    return result
