"""Range observers and the scheme-exact step from a range to (scale, zero point).

Observers stream: :class:`MinMax` keeps running extremes (per tensor or per channel);
:class:`Histogram` keeps a fixed number of bins whose range grows by re-binning, so
memory stays bounded however much data is calibrated. ``mse`` searches the clipping range
whose quantization, *with the scheme's own quantizer* (power-of-two scales and rounding
mode included), has the least squared error on the histogram; ``percentile`` clips at a
percentile of it. Registry: :data:`OBSERVERS` (adding one is one class and one YAML
line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .fake_quant import EPS, fake_quantize, pow2


@dataclass(frozen=True)
class Spec:
    """One quantizer's exact arithmetic: integer range, symmetry, scale rule, rounding."""

    qmin: int
    qmax: int
    symmetric: bool
    signed: bool
    pow2: bool
    rounding: str
    axis: int | None = None

    def qparams(self, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale and zero point for the range ``[low, high]`` (widened to include 0).

        Symmetric signed: ``scale = max|x| / qmax``, zero point 0 (TensorRT, TFLite and
        SNPE weights). Symmetric unsigned: the zero point sits mid-range. Asymmetric:
        ``scale = (high - low) / (qmax - qmin)``, ``zero_point = qmin - round(low / scale)``.
        Power-of-two schemes round the scale to the nearest power of two, then refit the
        zero point.
        """
        low = torch.minimum(low.double(), torch.zeros_like(low, dtype=torch.float64))
        high = torch.maximum(high.double(), torch.zeros_like(high, dtype=torch.float64))
        if self.symmetric:
            amax = torch.maximum(-low, high)
            if self.signed:
                scale = amax / self.qmax
                zero = torch.zeros_like(scale)
            else:
                scale = amax / ((self.qmax - self.qmin) / 2)
                zero = torch.full_like(scale, float((self.qmin + self.qmax + 1) // 2))
        else:
            scale = (high - low) / (self.qmax - self.qmin)
            zero = None
        scale = scale.float().clamp_min(EPS)
        if self.pow2:
            scale = pow2(scale)
        if zero is None:
            zero = torch.clamp(self.qmin - torch.round(low / scale.double()), self.qmin, self.qmax)
        return scale, zero.float()

    def fake_quantize(
        self, x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor
    ) -> torch.Tensor:
        return fake_quantize(x, scale, zero, self.qmin, self.qmax, self.rounding, self.axis)


class MinMax:
    """Running minimum and maximum, per tensor or per channel (``spec.axis``)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.low: torch.Tensor | None = None
        self.high: torch.Tensor | None = None

    def observe(self, x: torch.Tensor) -> None:
        x = x.detach().float()
        if self.spec.axis is None:
            low, high = x.min().reshape(1), x.max().reshape(1)
        else:
            flat = x.transpose(0, self.spec.axis).reshape(x.shape[self.spec.axis], -1)
            low, high = flat.min(dim=1).values, flat.max(dim=1).values
        self.low = low if self.low is None else torch.minimum(self.low, low)
        self.high = high if self.high is None else torch.maximum(self.high, high)

    @property
    def observed(self) -> bool:
        return self.low is not None

    def range(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.low is not None and self.high is not None
        return self.low, self.high


class Histogram(MinMax):
    """A streaming histogram over the observed range (per tensor only)."""

    BINS = 2048

    def __init__(self, spec: Spec, percentile: float = 99.99) -> None:
        super().__init__(spec)
        self.percentile = percentile
        self.counts = torch.zeros(self.BINS, dtype=torch.float64)

    def observe(self, x: torch.Tensor) -> None:
        x = x.detach().float().reshape(-1)
        old = self.range() if self.observed else None
        super().observe(x)
        low, high = self.range()
        lo, hi = float(low), float(high)
        if hi <= lo:
            hi = lo + EPS
        if old is not None and (float(old[0]), float(old[1])) != (lo, hi):
            # Re-bin what was seen into the wider range (counts at the old bin centres).
            edges = torch.linspace(float(old[0]), float(old[1]), self.BINS + 1)
            centres = ((edges[:-1] + edges[1:]) / 2).double()
            self.counts = torch.histogram(
                centres, bins=self.BINS, range=(lo, hi), weight=self.counts
            ).hist
        self.counts += torch.histogram(x.double(), bins=self.BINS, range=(lo, hi)).hist

    def _centres(self) -> torch.Tensor:
        low, high = self.range()
        edges = torch.linspace(float(low), max(float(high), float(low) + EPS), self.BINS + 1)
        return ((edges[:-1] + edges[1:]) / 2).float()

    def percentile_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        low, high = self.range()
        cdf = torch.cumsum(self.counts, 0) / self.counts.sum().clamp_min(1)
        tail = (100.0 - self.percentile) / 100.0
        edges = torch.linspace(float(low), float(high), self.BINS + 1)
        lo_bin = int(torch.searchsorted(cdf, torch.tensor(tail, dtype=cdf.dtype)))
        hi_bin = int(torch.searchsorted(cdf, torch.tensor(1 - tail, dtype=cdf.dtype)))
        new_low = edges[min(lo_bin, self.BINS)].reshape(1)
        new_high = edges[min(hi_bin + 1, self.BINS)].reshape(1)
        # Never clip a one-signed tensor past zero.
        return torch.minimum(new_low, low.clamp(min=0)), new_high

    def mse_range(self, steps: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
        """The shrunken range whose exact quantization has the least squared error."""
        low, high = self.range()
        centres, weights = self._centres(), self.counts.float()
        best: tuple[float, torch.Tensor, torch.Tensor] | None = None
        for i in range(steps):
            ratio = 1.0 - 0.7 * i / steps
            cand_low, cand_high = low * ratio, high * ratio
            scale, zero = self.spec.qparams(cand_low, cand_high)
            error = float(
                (weights * (self.spec.fake_quantize(centres, scale, zero) - centres) ** 2).sum()
            )
            if best is None or error < best[0]:
                best = (error, cand_low, cand_high)
        assert best is not None
        return best[1], best[2]


def observe_range(observer: MinMax, algorithm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The range an algorithm picks from what ``observer`` saw."""
    if algorithm == "percentile" and isinstance(observer, Histogram):
        return observer.percentile_range()
    if algorithm == "mse" and isinstance(observer, Histogram):
        return observer.mse_range()
    return observer.range()


#: Calibration algorithm -> observer class.
OBSERVERS: dict[str, Any] = {"minmax": MinMax, "mse": Histogram, "percentile": Histogram}
