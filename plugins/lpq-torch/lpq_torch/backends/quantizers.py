"""The quantizer module the simulator inserts: observe, then quantize, or learn (QAT).

One :class:`FakeQuantizer` per quantized tensor. Its life:

1. ``observe`` (calibration): passes values through unchanged and feeds its observer;
2. :meth:`FakeQuantizer.freeze`: the observer's range becomes a scale and zero point by
   the scheme's exact rule (:meth:`~lpq_torch.backends.observers.Spec.qparams`), and
   from then on it fake-quantizes (``quantize``), bit-exactly as the backend;
3. QAT: :meth:`FakeQuantizer.learn` starts an LSQ, LSQ+ or PACT quantizer from those
   parameters (``learn``); :meth:`FakeQuantizer.freeze` afterwards rounds the learned
   parameters to what the backend can represent (power of two, integer zero point).

In ``quantize`` mode the forward pass is plain tensor arithmetic (no autograd function),
so a PTQ model exports, compiles and saves like any module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lpq import ConfigError

from .fake_quant import EPS, LSQ, PACT, lsq_grad_scale, pow2, pow2_ste, quantize_codes
from .observers import OBSERVERS, MinMax, Spec, observe_range

#: QAT methods: lsq (learnable scale), lsq_plus (scale and zero point), pact (clip level).
QAT_METHODS = ("lsq", "lsq_plus", "pact")


class FakeQuantizer(nn.Module):
    """Observes, then fake-quantizes one tensor (weights: per channel along ``axis``)."""

    def __init__(self, spec: Spec, algorithm: str = "minmax", *, weight: bool = False) -> None:
        super().__init__()
        if algorithm not in OBSERVERS:
            raise ConfigError(
                f"calibration algorithm {algorithm!r} is not supported by lpq-torch's backend "
                "simulation",
                hint=f"use one of {', '.join(OBSERVERS)}",
            )
        if spec.axis is not None and OBSERVERS[algorithm] is not MinMax:
            algorithm = "minmax"  # per-channel ranges are min/max (as every backend does)
        self.spec = spec
        self.algorithm = algorithm
        self.weight = weight
        self.mode = "observe"
        self.method: str | None = None
        self.observer: MinMax = OBSERVERS[algorithm](spec)
        self.scale: torch.Tensor
        self.zero_point: torch.Tensor
        self.register_buffer("scale", torch.ones(1))
        self.register_buffer("zero_point", torch.zeros(1))
        self.learned_scale: nn.Parameter | None = None
        self.learned_zero_point: nn.Parameter | None = None
        self.alpha: nn.Parameter | None = None

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"mode={self.mode}, range=[{s.qmin}, {s.qmax}], "
            f"{'sym' if s.symmetric else 'asym'}, axis={s.axis}, pow2={s.pow2}, "
            f"rounding={s.rounding}, algorithm={self.algorithm}, method={self.method}"
        )

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "observe":
            self.observer.observe(x)
            return x
        if self.mode == "learn":
            return self._learned(x)
        return self.spec.fake_quantize(x, self.scale, self.zero_point)

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        """Integer codes of ``x`` (for exporting quantized weights)."""
        s = self.spec
        return quantize_codes(x, self.scale, self.zero_point, s.qmin, s.qmax, s.rounding, s.axis)

    def _learned(self, x: torch.Tensor) -> torch.Tensor:
        s = self.spec
        if self.method == "pact":
            assert self.alpha is not None
            out: torch.Tensor = PACT.apply(
                x, self.alpha, s.qmin, s.qmax, s.rounding, s.symmetric, s.pow2
            )
            return out
        assert self.learned_scale is not None and self.learned_zero_point is not None
        scale = self.learned_scale.clamp_min(EPS)
        if s.pow2:
            scale = pow2_ste(scale)
        grad_scale = lsq_grad_scale(x, s.qmax, s.axis, per_sample=not self.weight)
        zero: torch.Tensor = self.learned_zero_point
        if self.method == "lsq":
            zero = zero.detach()
        learned: torch.Tensor = LSQ.apply(
            x, scale, zero, s.qmin, s.qmax, s.rounding, s.axis, grad_scale
        )
        return learned

    # ------------------------------------------------------------------ life cycle

    def freeze(self) -> None:
        """Fix scale and zero point (from the observer, or from what QAT learned)."""
        if self.mode == "learn":
            self._freeze_learned()
        elif self.mode == "observe":
            if not self.observer.observed:
                raise ConfigError(
                    "a quantizer saw no data during calibration",
                    hint="calibrate with data that runs through the whole model",
                )
            low, high = observe_range(self.observer, self.algorithm)
            scale, zero = self.spec.qparams(low, high)
            self.scale = scale.to(self.scale.device)
            self.zero_point = zero.to(self.zero_point.device)
        self.mode = "quantize"

    def learn(self, method: str) -> None:
        """Start learning from the frozen parameters (QAT)."""
        if method not in QAT_METHODS:
            raise ConfigError(
                f"QAT method {method!r} is unknown", hint=f"use one of {', '.join(QAT_METHODS)}"
            )
        if self.mode == "observe":
            self.freeze()
        s = self.spec
        if method == "pact" and (self.weight or not self._pact_fits()):
            method = "lsq_plus" if not s.symmetric else "lsq"
        if method == "lsq_plus" and s.symmetric:
            method = "lsq"  # a symmetric scheme fixes the zero point
        self.method = method
        if method == "pact":
            levels = s.qmax if s.symmetric else s.qmax - s.qmin
            self.alpha = nn.Parameter((self.scale * levels).reshape(1).clone())
        else:
            self.learned_scale = nn.Parameter(self.scale.clone())
            self.learned_zero_point = nn.Parameter(
                self.zero_point.clone(), requires_grad=method == "lsq_plus"
            )
        self.mode = "learn"

    def _pact_fits(self) -> bool:
        """PACT clips at [0, alpha] for asymmetric schemes: only for non-negative tensors."""
        if self.spec.symmetric:
            return True
        low = self.observer.low
        return low is not None and float(low.min()) >= 0

    def _freeze_learned(self) -> None:
        s = self.spec
        with torch.no_grad():
            if self.method == "pact":
                assert self.alpha is not None
                levels = s.qmax if s.symmetric else s.qmax - s.qmin
                scale = (self.alpha.detach().reshape(1).clamp_min(EPS)) / levels
                zero = torch.zeros(1) if s.symmetric else torch.full((1,), float(s.qmin))
            else:
                assert self.learned_scale is not None and self.learned_zero_point is not None
                scale = self.learned_scale.detach().clamp_min(EPS)
                zero = torch.clamp(torch.round(self.learned_zero_point.detach()), s.qmin, s.qmax)
            if s.pow2:
                scale = pow2(scale)
            self.scale = scale.clone()
            self.zero_point = zero.clone()
        self.learned_scale = self.learned_zero_point = self.alpha = None

    def describe(self) -> dict[str, Any]:
        """The quantization parameters as plain data (for parameter files and tests)."""
        s = self.spec
        return {
            "scale": [float(v) for v in self.scale.reshape(-1)],
            "zero_point": [int(v) for v in self.zero_point.reshape(-1)],
            "qmin": s.qmin,
            "qmax": s.qmax,
            "symmetric": s.symmetric,
            "signed": s.signed,
            "axis": s.axis,
            "pow2": s.pow2,
            "rounding": s.rounding,
            "bits": (s.qmax - s.qmin).bit_length(),
        }


class BiasQuantizer(nn.Module):
    """int32 bias quantization with scale ``input_scale * weight_scale`` (per channel).

    Called as ``bias_quantizer(bias, input_scale, weight_scale)`` with the scale buffers of
    the op's input and weight quantizers; passes the bias through until :meth:`freeze`
    (calibration and QAT see the float bias, as backends' own tools do).
    """

    INT32 = (-(2**31), 2**31 - 1)

    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def extra_repr(self) -> str:
        return f"int32, active={self.active}"

    def scale_of(self, input_scale: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
        return (input_scale.reshape(()) * weight_scale.reshape(-1)).float()

    def forward(
        self, bias: torch.Tensor, input_scale: torch.Tensor, weight_scale: torch.Tensor
    ) -> torch.Tensor:
        if not self.active:
            return bias
        scale = self.scale_of(input_scale, weight_scale)
        return self.codes(bias, scale) * scale

    def codes(self, bias: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.clamp(torch.round(bias / scale), *self.INT32)

    def freeze(self) -> None:
        self.active = True
