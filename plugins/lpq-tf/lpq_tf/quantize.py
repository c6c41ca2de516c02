"""Apply a tune_cfg to a TensorFlow model: pick the quantizer that can express it exactly.

* **TFLite converter** (Keras / SavedModel inputs), the maintained path:
  - full-integer int8, every quantized op alike: calibrate once, then quantize per trial
    with the op-wise fp32 fallbacks as *denylisted nodes* (the converter's selective
    quantization, as ``tf.lite.experimental.QuantizationDebugger`` applies it);
  - 16x8 or dynamic range for the whole model (the converter has no per-op switch there).
* **ai-edge-quantizer** (Google's per-op recipe quantizer) for everything else: float
  ``.tflite`` inputs, 16x8 or dynamic with per-op fallbacks, int8/int16 mixes, per-op
  weight granularity, fp16 weights per op.

Ops of the capability that the tune_cfg omits stay float, as the contract asks. A
CONCATENATION whose inputs' calibrated ranges cannot share one int8 scale stays fp32
(:mod:`lpq_tf.shared_scale`), and so do the ops that compute the model's outputs
(:mod:`lpq_tf.output_heads`). With the ``latency_aware`` option (on for ``lpq
quantize``), :mod:`lpq_tf.latency` then keeps in fp32 the ops that make the model slower
on this machine, and the returned model's tune_cfg says so. The input model is never
modified. Which quantizer ran is recorded on the result. The work of each quantizer is in
:mod:`lpq_tf.passes`; this module only checks and routes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lpq import ConfigError, LpqError, ModelError, OpConfig, TuneConfig
from lpq.ranges import keep_float

from . import calibration, latency, shared_scale
from .capability import load_spec, quantizable_ops
from .graph import read
from .model_io import Prepared, prepare
from .naming import match_ops
from .output_heads import output_heads
from .passes.aeq import quantize_with_aeq
from .passes.converter import quantize_with_converter
from .qmodel import QuantizedModel
from .runtime import Runner

log = logging.getLogger("lpq.tf")

CONVERTER = "tflite-converter"
#: At most this many ops kept fp32 because LiteRT has no kernel for them quantized.
MAX_NO_KERNEL = 20
AEQ = "ai-edge-quantizer"
FLOAT = "float"
_IO_DTYPES = ("float32", "int8")


def quantize(
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | calibration.Samples | None,
    train_func: Callable[[Any], Any] | None = None,
) -> QuantizedModel:
    """Calibrate and quantize ``model`` as ``tune_cfg`` says; see the module docstring.

    ``calib_dataloader`` may also be the :class:`~lpq_tf.calibration.Samples` of an
    earlier quantization (fp16 casting re-quantizes with them). ``train_func`` is refused:
    LiteRT models are quantized after training only.
    """
    if train_func is not None:
        raise ConfigError(
            "the tf adaptor does only post-training quantization",
            hint="train with quantization-aware training in Keras yourself, or use lpq-torch",
        )
    prepared = prepare(model)
    by_name = {name: (op_type, tensor) for name, op_type, tensor in prepared.ops()}
    unknown = [name for name, _ in tune_cfg.ops if name not in by_name]
    if unknown:
        raise ConfigError(
            f"the tune_cfg names op(s) the model does not have: {', '.join(unknown[:5])}",
            hint="build the tune_cfg from this model's capability (lpq capability / "
            "pm.query_capability)",
        )
    for (name, _), cfg in tune_cfg.ops.items():
        _check_op_config(name, cfg)
    options = dict(tune_cfg.options)
    io_dtype = str(options.get("io_dtype", "float32"))
    if io_dtype not in _IO_DTYPES:
        raise ConfigError(f"unknown io_dtype {io_dtype!r}", hint="use float32 or int8")
    configs = _all_op_configs(prepared, tune_cfg)
    samples = _samples(prepared, configs, tune_cfg, calib_dataloader)
    unshareable = shared_scale.unshareable_ops(prepared, configs, samples, options)
    heads = output_heads(prepared, configs, options)
    in_heads = {name for head in heads for name in head.ops}
    unshareable = [op for op in unshareable if op.op not in in_heads]
    if heads or unshareable:
        tune_cfg = keep_float(tune_cfg, [*heads, *unshareable], log)
        configs = _all_op_configs(prepared, tune_cfg)

    def convert(chosen: dict[str, OpConfig]) -> tuple[bytes, str]:
        route = choose_route(prepared, chosen)
        if route == FLOAT:
            return prepared.float_tflite, route
        if route == CONVERTER:
            return quantize_with_converter(prepared, chosen, samples, io_dtype), route
        by_tensor = {by_name[name][1]: cfg for name, cfg in chosen.items()}
        return quantize_with_aeq(prepared, by_tensor, samples, io_dtype), route

    for attempt in range(MAX_NO_KERNEL + 1):
        content, route = convert(configs)
        missing = no_kernel(QuantizedModel(content, tune_cfg, prepared.ops(), route))
        # An op LiteRT has no kernel for as quantized (MediaPipe's pose detector: a conv
        # whose int8 weights ai-edge-quantizer gave a zero point) stays fp32, as a user
        # would keep it; each such op costs one more conversion.
        cfg = configs.get(missing.name) if missing is not None and missing.name else None
        if missing is None or cfg is None or not cfg.quantized or attempt == MAX_NO_KERNEL:
            break
        log.info(
            "kept fp32: %s (%s): LiteRT has no kernel for it as quantized (%s)",
            missing.name,
            missing.op_type,
            missing.reason,
        )
        tune_cfg = tune_cfg.with_fallbacks([missing.name])
        configs = _all_op_configs(prepared, tune_cfg)
    if missing is not None:
        raise _no_kernel_error(missing)
    loaded = content  # LiteRT has loaded this one
    decision = None
    if route != FLOAT and latency.wanted(options, io_dtype):
        decision, content = latency.choose(
            float_tflite=prepared.float_tflite,
            configs=configs,
            op_types={name: op_type for name, (op_type, _) in by_name.items()},
            samples=samples,
            options=options,
            convert=lambda chosen: convert(chosen)[0],
            planned=content,
        )
        # What the model now runs, decided: quantizing with it again gives the same model
        # without measuring anew (lpq_resolved_config).
        tune_cfg = tune_cfg.with_fallbacks(decision.keep_float).with_options(
            {"latency_aware": False}
        )
        if decision.keep_float:
            configs = _all_op_configs(prepared, tune_cfg)
            route = choose_route(prepared, configs)
    qmodel = QuantizedModel(
        content,
        tune_cfg,
        prepared.ops(),
        route,
        quantizable=list(configs),
        options=dict(tune_cfg.options),
        source=prepared,
        samples=samples,
        latency=decision.to_json() if decision is not None else None,
    )
    if qmodel.content is not loaded:
        check_runs(qmodel)
    return qmodel


@dataclass(frozen=True)
class NoKernel:
    """An op of a quantized model LiteRT has no kernel for, as LiteRT reported it."""

    #: the op's lpq name (None where LiteRT's node could not be matched to one)
    name: str | None
    node: str
    op_type: str
    reason: str


def no_kernel(qmodel: QuantizedModel) -> NoKernel | None:
    """Load the quantized model in LiteRT once: the op it has no kernel for, or None."""
    try:
        Runner(qmodel.content).prepare()
    except LpqError as exc:
        reason = exc.message.split(": ", 1)[-1][:160]
        node = re.search(r"Node number (\d+) \((\w+)\)", exc.message)
        if node is None:
            return NoKernel(None, "", "", reason)
        index = int(node.group(1))
        matched = match_ops(qmodel.float_ops, read(qmodel.content))
        name = next((n for n, op in matched.items() if op.index == index), None)
        return NoKernel(name, node.group(1), node.group(2), reason)
    return None


def check_runs(qmodel: QuantizedModel) -> None:
    """Load the quantized model in LiteRT once, so that a model with an op no kernel can
    run (e.g. a 16x8 depthwise conv whose scales overflow) fails here, naming the op,
    instead of in the middle of an evaluation."""
    missing = no_kernel(qmodel)
    if missing is not None:
        raise _no_kernel_error(missing)


def _no_kernel_error(missing: NoKernel) -> ModelError:
    where = f"op {missing.name or missing.node} ({missing.op_type}) " if missing.node else ""
    return ModelError(
        f"LiteRT cannot run the model as quantized: {where}has no kernel for its "
        f"quantization ({missing.reason})",
        hint="keep that op in fp32, or quantize it another way (int8 instead of 16x8)",
    )


def _check_op_config(name: str, cfg: OpConfig) -> None:
    if not cfg.quantized:
        if cfg.precision == "bf16":
            raise ConfigError(
                f"op {name}: LiteRT has no bf16 kernels on CPU",
                hint="keep the op in fp32, or use fp16 (float16 weights)",
            )
        return
    if cfg.mode not in ("static", "dynamic"):
        raise ConfigError(
            f"op {name}: LiteRT has no {cfg.mode!r} quantization",
            hint="use static (int8 or 16x8) or dynamic",
        )
    activation = cfg.activation.dtype if cfg.activation else "int8"
    if cfg.mode == "static" and activation not in ("int8", "int16"):
        raise ConfigError(
            f"op {name}: activations in {activation} are not a TFLite quantization",
            hint="use int8 (full integer) or int16 (16x8)",
        )
    weight = cfg.weight.dtype if cfg.weight else "int8"
    if weight != "int8":
        raise ConfigError(
            f"op {name}: weights in {weight}: LiteRT's CPU kernels take int8 weights",
            hint="use int8 weights",
        )


def _all_op_configs(prepared: Prepared, tune_cfg: TuneConfig) -> dict[str, OpConfig]:
    """Every capability op's config; ops the tune_cfg omits stay fp32."""
    configs = {name: OpConfig.fallback() for name, _ in quantizable_ops(prepared)}
    configs.update({name: cfg for (name, _), cfg in tune_cfg.ops.items()})
    return configs


def _signature(cfg: OpConfig) -> tuple[Any, ...]:
    activation = cfg.activation.dtype if cfg.activation else None
    return (cfg.precision, cfg.mode, activation)


def choose_route(prepared: Prepared, configs: dict[str, OpConfig]) -> str:
    """``float``, ``tflite-converter`` or ``ai-edge-quantizer`` for this set of choices."""
    quantized = {name: cfg for name, cfg in configs.items() if cfg.quantized}
    if any(cfg.precision == "fp16" for cfg in configs.values()):
        return AEQ
    if not quantized:
        return FLOAT
    if prepared.saved_model_dir is None:
        return AEQ  # a .tflite input: the converter needs a SavedModel
    kinds = {_signature(cfg) for cfg in quantized.values()}
    granularities = {cfg.weight.granularity for cfg in quantized.values() if cfg.weight}
    if len(kinds) != 1 or len(granularities) > 1:
        return AEQ  # the converter's per-channel switch is model-wide
    precision, mode, activation = next(iter(kinds))
    if mode == "static" and activation == "int8":
        return CONVERTER  # fallbacks become denylisted nodes
    # 16x8 and dynamic range are whole-model switches in the converter: use it only when
    # every op that could take the mode does.
    spec = load_spec()
    types = {name: op_type for name, op_type, _ in prepared.ops()}
    eligible = [
        name
        for name in configs
        if any(c.precision == precision and c.mode == mode for c in spec.for_op_type(types[name]))
    ]
    return CONVERTER if all(name in quantized for name in eligible) else AEQ


def _samples(
    prepared: Prepared,
    configs: dict[str, OpConfig],
    tune_cfg: TuneConfig,
    dataloader: Iterable[Any] | calibration.Samples | None,
) -> calibration.Samples | None:
    if not any(cfg.quantized and cfg.mode == "static" for cfg in configs.values()):
        return None
    if isinstance(dataloader, calibration.Samples):
        return dataloader
    return calibration.collect(prepared.float_tflite, dataloader, tune_cfg.calib_sampling_size)
