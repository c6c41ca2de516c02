"""Does a dequantized weight lie on an integer quantization grid?

A weight quantized to int8 and read back dequantized is ``scale * (q - zero_point)`` with
integer ``q`` and ``zero_point``: every value is an integer multiple of ``scale``, per
tensor or per channel of some axis. fp32 weights are not. The grid is found from the
largest magnitude ``m``: ``m = scale * n`` for an integer ``n <= 255`` (127 or 128 for
symmetric int8, 63/64 for 7-bit ``reduce_range``, up to 255 for asymmetric uint8), so
``scale`` is ``m / n`` for one of 255 candidates, and the values must land within
:data:`TOLERANCE` of its integer multiples. The axis is not assumed (ONNX MatMul weights
are ``[in, out]``, torch Linear ``[out, in]``, TF kernels channels-last): any axis whose
every slice is on a grid of its own, or the whole tensor on one, counts.
"""

from __future__ import annotations

import numpy as np

#: How far (in grid steps) a dequantized value may sit from an integer multiple of its
#: scale: float32 rounding of ``scale * q`` is ~1e-5 steps; a random fp32 weight lands
#: this close to a grid point with probability 0.002 per value.
TOLERANCE = 1e-3
#: Largest ``|q - zero_point|`` of an 8-bit integer.
MAX_LEVEL = 255
#: Distinct values one channel of an 8-bit weight can hold.
MAX_DISTINCT = 256


def _rows_on_grid(rows: np.ndarray) -> np.ndarray:
    """Per row of a 2-D float64 array: whether its values lie on one integer grid."""
    top = np.abs(rows).max(axis=1, keepdims=True)
    zero = top[:, 0] == 0
    top = np.where(top == 0, 1.0, top)
    found = zero.copy()
    for level in range(1, MAX_LEVEL + 1):
        pending = ~found
        if not pending.any():
            break
        scaled = rows[pending] * (level / top[pending])
        found[pending] = np.all(np.abs(scaled - np.round(scaled)) <= TOLERANCE, axis=1)
    distinct = np.array([np.unique(row).size <= MAX_DISTINCT for row in rows], bool)
    result: np.ndarray = found & distinct
    return result


def on_grid(weight: np.ndarray) -> bool:
    """Whether ``weight`` is quantized per tensor, or per channel along some axis."""
    array = np.asarray(weight, np.float64)
    if array.size == 0 or not np.all(np.isfinite(array)):
        return False
    if bool(_rows_on_grid(array.reshape(1, -1))[0]):
        return True
    for axis in range(array.ndim):
        if array.shape[axis] > 1:
            rows = np.moveaxis(array, axis, 0).reshape(array.shape[axis], -1)
            if bool(_rows_on_grid(rows).all()):
                return True
    return False
