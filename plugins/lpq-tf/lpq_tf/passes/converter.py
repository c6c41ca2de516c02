"""Quantizing with the TFLite converter (Keras and SavedModel inputs).

Full-integer int8 is done in two steps, as the converter does internally: calibrate once
(cached), then ``mlir_quantize`` the calibrated model with the fp32 ops as denylisted
nodes. This is the call behind ``QuantizationDebugger.get_nondebug_quantized_model()``
(the debugger's ``denylisted_nodes`` option) without the debug model it also builds.
16x8 and dynamic range go through ``converter.convert()`` with the matching settings.
"""

from __future__ import annotations

from typing import Any

from lpq import OpConfig

from ..calibration import Samples, converter_calibrated
from ..model_io import Prepared, converter_error, run_converter
from ..tfenv import import_tf, quietly
from .moving import following_float


def quantize_with_converter(
    prepared: Prepared, configs: dict[str, OpConfig], samples: Samples | None, io_dtype: str
) -> bytes:
    """The quantized model; every quantized op of ``configs`` has the same choice (the
    converter's switches are model-wide), fp32 ops are denylisted in int8 (and the ops
    that only carry their outputs, :func:`~lpq_tf.passes.moving.following_float`)."""
    quantized = [cfg for cfg in configs.values() if cfg.quantized]
    first = quantized[0]
    per_channel = first.weight is None or first.weight.granularity == "per_channel"
    activation = first.activation.dtype if first.activation else "int8"
    if first.mode == "dynamic":
        return _whole_model(prepared, None, per_channel, "dynamic", io_dtype)
    assert samples is not None
    if activation == "int16":
        return _whole_model(prepared, samples, per_channel, "16x8", io_dtype)
    tensors = {name: tensor for name, _, tensor in prepared.ops()}
    denylist = [tensors[name] for name, cfg in configs.items() if not cfg.quantized]
    denylist += following_float(prepared, {tensors[name]: cfg for name, cfg in configs.items()})
    return _static_int8(prepared, samples, denylist, per_channel, io_dtype)


def _static_int8(
    prepared: Prepared, samples: Samples, denylist: list[str], per_channel: bool, io_dtype: str
) -> bytes:
    tf = import_tf()
    from tensorflow.lite.python import convert as tflite_convert

    calibrated = converter_calibrated(prepared, samples)
    io_type = tf.int8 if io_dtype == "int8" else tf.float32
    return quietly(
        lambda: bytes(
            tflite_convert.mlir_quantize(
                calibrated,
                disable_per_channel=not per_channel,
                input_data_type=io_type,
                output_data_type=io_type,
                denylisted_nodes=denylist,
            )
        ),
        converter_error,
    )


def _whole_model(
    prepared: Prepared, samples: Samples | None, per_channel: bool, kind: str, io_dtype: str
) -> bytes:
    tf = import_tf()
    assert prepared.saved_model_dir is not None

    def configure(converter: Any) -> None:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter._experimental_disable_per_channel = not per_channel
        if samples is not None:
            converter.representative_dataset = samples.as_lists
        if kind == "16x8":
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
                tf.lite.OpsSet.TFLITE_BUILTINS,  # ops without a 16x8 kernel stay float
            ]
            if io_dtype == "int8":
                converter.inference_input_type = tf.int16
                converter.inference_output_type = tf.int16

    return run_converter(prepared.saved_model_dir, configure)
