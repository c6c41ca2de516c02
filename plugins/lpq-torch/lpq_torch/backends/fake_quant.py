"""Fake quantization as backends compute it, and the learnable quantizers of QAT.

:func:`fake_quantize` is the exact arithmetic of ONNX's QuantizeLinear/DequantizeLinear
pair (``q = clamp(round(x / scale) + zero_point, qmin, qmax)``, ``y = (q - zero_point) *
scale``, in float32), with the backend's rounding of ``x / scale`` and its integer range.
PTQ models run it with fixed scales; it is also what the ONNX export encodes.

QAT quantizers learn their parameters with straight-through estimators (STE):

* :class:`LSQ` (Esser et al., 2020): learnable scale, and with a learnable zero point
  LSQ+ (Bhalgat et al., 2020). Gradients, with ``v = x / s + z`` (unrounded) and
  ``in = qmin <= v <= qmax``: ``dy/dx = in``; ``dy/ds = round(v) - v`` inside,
  ``qmin - z`` below, ``qmax - z`` above; ``dy/dz = 0`` inside and ``-s`` outside. The
  scale (and zero point) gradients are multiplied by LSQ's ``grad_scale``
  ``1 / sqrt(numel_per_scale * qmax)``.
* :class:`PACT` (Choi et al., 2018): a learnable clipping level ``alpha``; ``y =
  fake_quantize(clamp(x, low, alpha))`` with ``scale = alpha / levels``, ``low`` being 0
  (asymmetric, non-negative activations) or ``-alpha`` (symmetric). ``dy/dx = 1`` inside
  the clip range, ``dy/dalpha = 1`` above it (``-1`` below ``-alpha``, symmetric), as
  in the paper.

Each gradient is the exact derivative of a *surrogate* in which the rounding residual is
frozen at the point of evaluation; the tests compare the backward passes with finite
differences of those surrogates. With power-of-two scales (:func:`pow2_ste`) the scale
used is ``2 ** round(log2(s))`` and its gradient passes straight through to ``s``.
"""

from __future__ import annotations

from typing import Any

import torch

#: Smallest scale a quantizer uses (an all-zero tensor would otherwise divide by zero).
EPS = 2.0**-20


def round_with(v: torch.Tensor, rounding: str) -> torch.Tensor:
    """Round to integers the way a backend does."""
    if rounding == "half_even":
        return torch.round(v)
    if rounding == "half_up":
        return torch.floor(v + 0.5)
    if rounding == "half_away":
        return torch.sign(v) * torch.floor(v.abs() + 0.5)
    raise ValueError(f"unknown rounding {rounding!r}")


def pow2(scale: torch.Tensor) -> torch.Tensor:
    """The nearest power of two in the log domain (Vitis AI's fixed-point positions)."""
    return torch.exp2(torch.round(torch.log2(scale)))


def pow2_ste(scale: torch.Tensor) -> torch.Tensor:
    """:func:`pow2` in value, ``scale``'s own gradient (straight through)."""
    return scale + (pow2(scale) - scale).detach()


def channel_view(t: torch.Tensor, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over ``x`` along ``axis``."""
    if axis is None or t.numel() == 1:
        return t.reshape(())
    shape = [1] * x.dim()
    shape[axis] = -1
    return t.reshape(shape)


def fake_quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    qmin: int,
    qmax: int,
    rounding: str = "half_even",
    axis: int | None = None,
) -> torch.Tensor:
    """Quantize-dequantize ``x`` exactly as the backend (and the exported QDQ) does."""
    s = channel_view(scale, x, axis)
    z = channel_view(zero_point, x, axis)
    q = torch.clamp(round_with(x / s, rounding) + z, qmin, qmax)
    return (q - z) * s


def quantize_codes(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    qmin: int,
    qmax: int,
    rounding: str = "half_even",
    axis: int | None = None,
) -> torch.Tensor:
    """The integer codes of :func:`fake_quantize` (what the exported weights store)."""
    s = channel_view(scale, x, axis)
    z = channel_view(zero_point, x, axis)
    return torch.clamp(round_with(x / s, rounding) + z, qmin, qmax)


def _sum_to(grad: torch.Tensor, like: torch.Tensor, axis: int | None) -> torch.Tensor:
    """Reduce a per-element gradient to the shape of a per-tensor/per-channel parameter."""
    if axis is None or like.numel() == 1:
        return grad.sum().reshape(like.shape)
    dims = [d for d in range(grad.dim()) if d != axis]
    return grad.sum(dim=dims).reshape(like.shape)


class LSQ(torch.autograd.Function):
    """LSQ / LSQ+ fake quantization with a learnable scale (and zero point)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        scale: torch.Tensor,
        zero_point: torch.Tensor,
        qmin: int,
        qmax: int,
        rounding: str,
        axis: int | None,
        grad_scale: float,
    ) -> torch.Tensor:
        s = channel_view(scale, x, axis)
        z = channel_view(torch.round(zero_point), x, axis)
        v = x / s
        rounded = round_with(v, rounding)
        q = torch.clamp(rounded + z, qmin, qmax)
        ctx.save_for_backward(v, rounded, s, z)
        ctx.config = (qmin, qmax, axis, grad_scale, scale.shape, zero_point.shape)
        return (q - z) * s

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        v, rounded, s, z = ctx.saved_tensors
        qmin, qmax, axis, grad_scale, scale_shape, zp_shape = ctx.config
        shifted = v + z
        below, above = shifted < qmin, shifted > qmax
        inside = ~(below | above)
        grad_x = grad * inside if ctx.needs_input_grad[0] else None
        grad_s = grad_z = None
        if ctx.needs_input_grad[1]:
            d_scale = torch.where(inside, rounded - v, torch.where(below, qmin - z, qmax - z))
            grad_s = _sum_to(grad * d_scale, torch.empty(scale_shape), axis) * grad_scale
        if ctx.needs_input_grad[2]:
            d_zero = (grad * ~inside) * -s
            grad_z = _sum_to(d_zero, torch.empty(zp_shape), axis) * grad_scale
        return grad_x, grad_s, grad_z, None, None, None, None, None


class PACT(torch.autograd.Function):
    """PACT: fake quantization of ``clamp(x, low, alpha)`` with a learnable ``alpha``.

    ``symmetric``: clip to ``[-alpha, alpha]`` with scale ``alpha / qmax`` and zero point
    0; otherwise clip to ``[0, alpha]`` with scale ``alpha / (qmax - qmin)`` and zero
    point ``qmin``. ``scale_fn`` maps the raw scale to the one used (power of two).
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        alpha: torch.Tensor,
        qmin: int,
        qmax: int,
        rounding: str,
        symmetric: bool,
        pow2_scale: bool,
    ) -> torch.Tensor:
        levels = qmax if symmetric else qmax - qmin
        scale = alpha.reshape(()).clamp_min(EPS) / levels
        if pow2_scale:
            scale = pow2(scale)
        top = scale * levels
        low = -top if symmetric else torch.zeros_like(top)
        zero = torch.zeros_like(scale) if symmetric else torch.full_like(scale, float(qmin))
        clipped = torch.maximum(torch.minimum(x, top), low)
        ctx.save_for_backward(x, low, top)
        ctx.symmetric = symmetric
        ctx.alpha_shape = alpha.shape
        return fake_quantize(clipped, scale, zero, qmin, qmax, rounding)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, low, top = ctx.saved_tensors
        above, below = x > top, x < low
        d_alpha = grad * above
        if ctx.symmetric:
            d_alpha = d_alpha - grad * below
        return (
            grad * ~(above | below),
            d_alpha.sum().reshape(ctx.alpha_shape),
            None,
            None,
            None,
            None,
            None,
        )


def lsq_grad_scale(x: torch.Tensor, qmax: int, axis: int | None, per_sample: bool) -> float:
    """LSQ's ``1 / sqrt(N * qmax)``: ``N`` values share one scale (per sample for
    activations, per channel for per-channel weights)."""
    count = x.numel()
    if axis is not None:
        count //= max(x.shape[axis], 1)
    elif per_sample and x.dim() > 1:
        count //= max(x.shape[0], 1)
    return float(1.0 / (max(count, 1) * max(qmax, 1)) ** 0.5)
