"""ONNX Runtime's integer range for symmetric int8 weights, which lpq's own weight maths
(bias correction, AdaRound) must match: otherwise ORT re-quantizes the weights lpq
prepared onto another grid and the correction is lost."""

from __future__ import annotations

from lpq import TensorConfig

#: Symmetric int8 weights use [-127, 127]; with ``reduce_range`` ORT uses [-64, 64].
FULL_QMAX = 127
REDUCED_QMAX = 64


def weight_qmax(weight: TensorConfig | None) -> int:
    """The largest integer code ORT gives a symmetric int8 weight under this config."""
    return REDUCED_QMAX if weight is not None and weight.reduce_range else FULL_QMAX
