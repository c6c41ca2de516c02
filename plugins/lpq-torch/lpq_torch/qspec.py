"""tune_cfg choices -> torchao ``QuantizationSpec`` / ``QuantizationConfig``.

This is where lpq dtypes become value ranges. Every integer dtype lives in an int8 or
uint8 container and is simulated through the observer's ``quant_min``/``quant_max``:
``int4`` is ``torch.int8`` with range [-8, 7], ``uint4`` is ``torch.uint8`` with [0, 15],
``int2`` is [-2, 1]. int8/uint8 use the full range and hit oneDNN's int8 kernels once
compiled; narrower dtypes give the same arithmetic (values just use fewer levels), so
their accuracy is exactly what a true N-bit kernel would give.

Activation algorithms map to observers through :data:`lpq_torch.calibration.OBSERVERS`;
weights always use (PerChannel)MinMaxObserver. QAT uses torchao's
``LearnableFakeQuantize`` (scale and zero point get gradients, LSQ-style).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torchao.quantization.pt2e import (
    LearnableFakeQuantize,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from torchao.quantization.pt2e.quantizer import QuantizationSpec
from torchao.quantization.pt2e.quantizer.utils import QuantizationConfig

from lpq import ConfigError, OpConfig, TensorConfig

from .calibration import OBSERVERS, activation_observer

#: Same eps as PyTorch's x86 recipe: keeps scales of near-constant tensors sane.
EPS = 2**-12
_DTYPE = re.compile(r"^(u?)int([2-8])$")


def dtype_range(dtype: str) -> tuple[torch.dtype, int, int]:
    """The container dtype and ``(quant_min, quant_max)`` of an lpq integer dtype."""
    match = _DTYPE.match(dtype)
    if match is None:
        raise ConfigError(
            f"the PyTorch adaptor cannot quantize to {dtype!r}",
            hint="use int8/uint8 or a narrower integer dtype (int2..int7, uint2..uint7)",
        )
    unsigned, bits = match.group(1) == "u", int(match.group(2))
    if unsigned:
        return torch.uint8, 0, 2**bits - 1
    return torch.int8, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _qscheme(cfg: TensorConfig, *, weight: bool) -> torch.qscheme:
    per_channel = cfg.granularity == "per_channel"
    if cfg.granularity not in ("per_channel", "per_tensor"):
        raise ConfigError(f"granularity {cfg.granularity!r} is not supported by lpq-torch")
    if per_channel and not weight:
        raise ConfigError("activations can only be quantized per_tensor in lpq-torch")
    if cfg.scheme == "sym":
        return torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric
    if weight:
        raise ConfigError(
            "the x86 PT2E recipe quantizes weights symmetrically only",
            hint="use scheme 'sym' for weights",
        )
    return torch.per_tensor_affine


def _learnable(
    observer: Any, dtype: Any, qmin: int, qmax: int, qscheme: Any, args: dict[str, Any]
) -> Any:
    """QAT fake quantizer with a learnable scale (gradients scaled as in LSQ)."""
    return LearnableFakeQuantize.with_args(
        observer=observer,
        quant_min=qmin,
        quant_max=qmax,
        dtype=dtype,
        qscheme=qscheme,
        use_grad_scaling=True,
        **args,
    )


def weight_spec(cfg: TensorConfig, *, qat: bool) -> QuantizationSpec:
    dtype, qmin, qmax = dtype_range(cfg.dtype)
    qscheme = _qscheme(cfg, weight=True)
    per_channel = qscheme == torch.per_channel_symmetric
    if cfg.algorithm not in OBSERVERS:
        raise ConfigError(f"weight algorithm {cfg.algorithm!r} is not supported by lpq-torch")
    args: dict[str, Any] = {"eps": EPS}
    if per_channel:
        args["ch_axis"] = 0
    if qat:
        observer = MovingAveragePerChannelMinMaxObserver if per_channel else MinMaxObserver
        ctr = _learnable(observer, dtype, qmin, qmax, qscheme, args)
    else:
        observer = PerChannelMinMaxObserver if per_channel else MinMaxObserver
        ctr = observer.with_args(**args)
    return QuantizationSpec(
        dtype=dtype,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=qscheme,
        ch_axis=0 if per_channel else None,
        is_dynamic=False,
        observer_or_fake_quant_ctr=ctr,
    )


def activation_spec(cfg: TensorConfig, *, qat: bool, dynamic: bool) -> QuantizationSpec:
    dtype, qmin, qmax = dtype_range(cfg.dtype)
    qscheme = _qscheme(cfg, weight=False)
    args: dict[str, Any] = {"eps": EPS}
    if dynamic:
        ctr: Any = PlaceholderObserver.with_args(**args)
    elif qat:
        ctr = _learnable(MovingAverageMinMaxObserver, dtype, qmin, qmax, qscheme, args)
    else:
        ctr = activation_observer(cfg.algorithm).with_args(**args)
    return QuantizationSpec(
        dtype=dtype,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=qscheme,
        is_dynamic=dynamic,
        observer_or_fake_quant_ctr=ctr,
    )


def quant_config(op: OpConfig, *, qat: bool) -> QuantizationConfig:
    """The torchao config for one op's tune_cfg entry (quantized precisions only)."""
    if op.mode not in ("static", "dynamic"):
        raise ConfigError(
            f"quantization mode {op.mode!r} is not supported by lpq-torch",
            hint="use 'static' or 'dynamic' (QAT is static + a train_func)",
        )
    dynamic = op.mode == "dynamic"
    act = activation_spec(op.activation, qat=qat, dynamic=dynamic) if op.activation else None
    weight = weight_spec(op.weight, qat=qat) if op.weight else None
    if act is None and weight is None:
        raise ConfigError(f"op config {op.to_json()} quantizes neither weight nor activation")
    # Dynamic quantization quantizes inputs on the fly and keeps float outputs.
    output = None if dynamic else act
    return QuantizationConfig(act, output, weight, None, is_qat=qat)
