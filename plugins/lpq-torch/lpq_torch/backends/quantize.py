"""Quantize for a backend: simulate its scheme, calibrate, optionally train (QAT), freeze.

This is ``lpq_quantize`` when the tune_cfg carries a backend scheme
(``options["backend_scheme"]``, set by core from the chosen backend profile), and the
Python API :func:`quantize_for_backend` for a scheme given directly (e.g. a shipped one
at 4 bits, as research on low-bit deployment needs).

PTQ: the model is exported (once per run), batch norm folded, quantizers inserted
(:mod:`~lpq_torch.backends.simulate`), calibrated on up to ``calib_sampling_size``
samples, and frozen to the scheme's exact scales. QAT (``train_func`` given): after that
calibration every quantizer becomes learnable (weights: LSQ; activations: the tune_cfg
option ``qat_method`` — ``lsq``, ``lsq_plus`` or ``pact``), ``train_func(model)`` trains
weights and quantizers together, and freezing rounds the learned parameters to what the
backend represents. Either way the result is a ``GraphModule`` whose forward pass is the
backend's arithmetic; :mod:`~lpq_torch.backends.onnx_export` exports it to QDQ ONNX.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from lpq import ConfigError, DataError, OpConfig, TensorConfig, TuneConfig, get_plugin_manager

from .. import model_io
from ..calibration import calibrate
from ..data import at_least_two, first_batch
from ..errors import stage
from ..graph import quantizable_nodes
from ..info import EXAMPLE_ATTR, TUNE_CFG_ATTR
from . import simulate
from .profiles import parse_scheme, scheme_of


def wanted(tune_cfg: TuneConfig) -> bool:
    """Whether this tune_cfg asks for backend simulation rather than the x86 PT2E path."""
    return bool(tune_cfg.options.get("backend_scheme"))


def quantize(
    model: Any,
    tune_cfg: TuneConfig,
    calib_dataloader: Iterable[Any] | None,
    train_func: Callable[[Any], Any] | None = None,
) -> torch.fx.GraphModule:
    """Simulate ``tune_cfg.options["backend_scheme"]`` on ``model`` (never modified)."""
    module = model_io.require_module(model)
    scheme = parse_scheme(tune_cfg.options["backend_scheme"])
    if calib_dataloader is None:
        raise DataError(
            "backend quantization calibrates its ranges and needs calibration data",
            hint="pass a calibration dataloader",
        )
    if any(cfg.quantized and cfg.mode != "static" for cfg in tune_cfg.ops.values()):
        raise ConfigError(
            "backend schemes are simulated in static mode only",
            hint="use mode 'static' (QAT is static + a train_func)",
        )
    args = first_batch(calib_dataloader)
    model_io.remember_example(module, args)
    gm = model_io.exported(module, args)
    present = {key for key, _ in quantizable_nodes(gm)}
    unknown = [key for key in tune_cfg.ops if key not in present]
    if unknown:
        shown = ", ".join(f"{name} ({op_type})" for name, op_type in unknown[:5])
        raise ConfigError(
            f"the tune_cfg names ops the model does not have: {shown}",
            hint="use op names and types from the capability query",
        )
    with stage("prepare", "the backend simulation (batch-norm folding, quantizers)"):
        sim = simulate.build(gm, scheme, tune_cfg)
    calibrate(sim, calib_dataloader, tune_cfg.calib_sampling_size)
    freeze(sim)
    if train_func is not None:
        learn(sim, str(tune_cfg.options.get("qat_method", "lsq")))
        sim.train()
        returned = train_func(sim)
        if isinstance(returned, torch.fx.GraphModule) and simulate.is_simulated(returned):
            sim = returned
        freeze(sim)
    sim.eval()
    sim.requires_grad_(False)
    setattr(sim, EXAMPLE_ATTR, at_least_two(args))
    setattr(sim, TUNE_CFG_ATTR, tune_cfg.to_json())
    getattr(sim, simulate.BACKEND_ATTR)["backend"] = tune_cfg.options.get("backend")
    return sim


def freeze(sim: torch.nn.Module) -> None:
    """Every quantizer to fixed, backend-exact parameters; int32 biases switched on."""
    for quantizer in simulate.quantizers(sim).values():
        quantizer.freeze()
    for bias in simulate.bias_quantizers(sim).values():
        bias.freeze()


def learn(sim: torch.nn.Module, method: str) -> None:
    """Make every quantizer learnable: LSQ for weights, ``method`` for activations."""
    for quantizer in simulate.quantizers(sim).values():
        quantizer.learn("lsq" if quantizer.weight else method)


def default_tune_cfg(
    ops: Iterable[tuple[str, str]], scheme: Any, algorithm: str = "minmax", calib_size: int = 100
) -> TuneConfig:
    """The scheme's own choice for every op (what the narrowed space offers first)."""
    chosen: dict[tuple[str, str], OpConfig] = {}
    for key in ops:
        if key[1] in scheme.float_ops:
            chosen[key] = OpConfig.fallback()
            continue
        weight = scheme.weight
        act = scheme.activation
        extra = {"reduce_range": True} if weight.reduce_range else {}
        chosen[key] = OpConfig(
            precision=weight.dtype.removeprefix("u"),
            mode="static",
            weight=(
                TensorConfig(weight.dtype, weight.scheme, weight.granularity, "minmax", extra)
                if key[1] != "matmul"
                else None
            ),
            activation=TensorConfig(act.dtype, act.scheme, "per_tensor", algorithm),
        )
    return TuneConfig(
        ops=chosen,
        calib_sampling_size=calib_size,
        options={"backend_scheme": scheme.to_json()},
    )


def quantize_for_backend(
    model: torch.nn.Module,
    backend: str | Any,
    calib_dataloader: Iterable[Any],
    train_func: Callable[[Any], Any] | None = None,
    *,
    bits: int | None = None,
    algorithm: str = "minmax",
    qat_method: str = "lsq",
    calib_size: int = 100,
) -> torch.fx.GraphModule:
    """Quantize ``model`` with a backend's scheme, no tuning (PTQ, or QAT with a train_func).

    :param backend: a registered profile name (``"tensorrt"``, ``"vitis"``, ...) or a
        scheme (an ``lpq`` ``QuantScheme`` or its JSON form).
    :param bits: simulate the scheme at this bit width for weights and activations
        (e.g. 4); every other rule of the backend stays.
    :param qat_method: activation quantizers for QAT: ``lsq``, ``lsq_plus`` or ``pact``.
    """
    scheme = scheme_of(backend)
    if bits is not None:
        scheme = scheme.with_bits(weight=bits, activation=bits)
    capability = get_plugin_manager().query_capability("torch", model, calib_dataloader, {})
    tune_cfg = default_tune_cfg(capability.opwise, scheme, algorithm, calib_size)
    tune_cfg.options["qat_method"] = qat_method
    if isinstance(backend, str):
        tune_cfg.options["backend"] = backend
    return quantize(model, tune_cfg, calib_dataloader, train_func)
