"""Per-channel weight quantization in whole-array numpy, the same bits as ORT's loops.

ORT's quantizers quantize a per-channel weight one channel at a time in Python: each
channel's range, scale and zero point (``compute_data_quant_params``), then its values
(``quantize_nparray``), and QDQ builds do the values a second time in
``quantize_onnx_initializer``. On MiniLM that is 54,000 calls and about 1.5 CPU s a
quantization; on a Gemm with 8210 output classes, 8210 iterations per build.

This module does the same arithmetic on all channels at once. Each step is the
elementwise operation ORT applies to one channel, with the same dtypes (float32 values
and scales, float64 range and zero-point arithmetic), so every value rounds the same way
and the models built are byte-identical (``tests/test_onnxrt_channelwise.py`` checks that
against ORT's own functions). Anything outside the plain case (user overrides of a
tensor's range, ``MinimumRealRange``, 4-bit or float8 types, float16 weights, empty
channels, block-wise quantization) is left to ORT, unchanged.

:func:`vectorized` installs it on one quantizer for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

#: ORT's integer types this module computes (values of ``onnx.TensorProto``): INT8,
#: UINT8, INT16, UINT16. Others go to ORT.
_PLAIN_TYPES = {2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16}


def channel_params(
    data: np.ndarray, axis: int, quant_type: int, symmetric: bool, reduce_range: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Zero points and scales of ``data``'s channels along ``axis``: what ORT's
    ``compute_data_quant_params`` returns for each channel, stacked (zero points in the
    quantized dtype, scales in ``data``'s float32)."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(quant_type, reduce_range, symmetric=symmetric)
    rows = _rows(data, axis)
    zero = np.zeros((), dtype=data.dtype)
    rmin = np.minimum(rows.min(axis=1), zero)
    rmax = np.maximum(rows.max(axis=1), zero)
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    # ORT: the range in float64, divided by the integer range in float64
    dq = np.array(qmax, dtype=np.float64) - np.array(qmin, dtype=np.float64)
    scale = (rmax.astype(np.float64) - rmin.astype(np.float64)) / dq
    degenerate = scale < np.finfo(data.dtype).tiny
    if symmetric:
        middle = np.round((qmin + qmax) / np.array(2.0, dtype=np.float64))
        zero_points = np.full(scale.shape, middle, dtype=qmin.dtype)
    else:
        safe = np.where(degenerate, 1.0, scale)
        zero_points = np.round(qmin - rmin / safe).astype(qmin.dtype)
    zero_points[degenerate] = 0
    scales = scale.astype(data.dtype)
    scales[degenerate] = 1.0
    return zero_points, scales


def quantize_channels(
    data: np.ndarray, axis: int, zero_points: np.ndarray, scales: np.ndarray, quant_type: int
) -> np.ndarray:
    """``data`` quantized channel by channel along ``axis`` with the given zero points
    and scales (ORT's ``quantize_nparray`` on each channel), in ``data``'s shape."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(quant_type)
    values = _rows(data, axis).astype(np.float32, copy=False) / scales[:, None]
    np.round(values, out=values)
    values += zero_points[:, None]
    np.clip(values, qmin, qmax, out=values)
    moved = values.astype(_PLAIN_TYPES[quant_type]).reshape(np.moveaxis(data, axis, 0).shape)
    return np.moveaxis(moved, 0, axis)


def quantized_initializer(
    weight: onnx.TensorProto,
    quant_type: int,
    zero_point: np.ndarray,
    scale: np.ndarray,
    axis: int | None,
    name: str,
    block_size: int = 0,
) -> onnx.TensorProto | None:
    """What ORT's ``quantize_onnx_initializer`` returns for a per-channel weight in the
    plain case; None where ORT's own function must do it."""
    from onnx import numpy_helper

    if axis is None or block_size or quant_type not in _PLAIN_TYPES:
        return None
    data = numpy_helper.to_array(weight)
    if not _plain_array(data) or np.ndim(scale) != 1 or np.ndim(zero_point) != 1:
        return None
    if not -data.ndim <= axis < data.ndim:
        return None  # ORT's own error
    axis %= data.ndim
    if len(scale) != data.shape[axis] or len(zero_point) != data.shape[axis]:
        return None
    return numpy_helper.from_array(
        quantize_channels(data, axis, zero_point, scale, quant_type), name
    )


#: Whether the QDQ weights' values are quantized by this module in this context.
_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("lpq_channelwise", default=False)


@contextlib.contextmanager
def vectorized(quantizer: Any) -> Iterator[None]:
    """Per-channel weights of ``quantizer`` (ORT's QDQQuantizer or ONNXQuantizer)
    quantized by this module while the block runs; ORT's code for everything else, and
    for everything where the installed ORT computes other bits (:func:`agrees_with_ort`)."""
    if not agrees_with_ort():
        yield
        return
    if hasattr(quantizer, "_calc_initializer_quant_params"):
        _wrap_qdq_params(quantizer)
    if hasattr(quantizer, "quantize_weight_per_channel_impl"):
        _wrap_qoperator(quantizer)
    token = _ON.set(True)
    try:
        yield
    finally:
        _ON.reset(token)
        # Wrappers left on the instance would keep it in a reference cycle
        for name in ("_calc_initializer_quant_params", "quantize_weight_per_channel_impl"):
            vars(quantizer).pop(name, None)


@functools.cache
def agrees_with_ort() -> bool:
    """Whether this module computes the installed ORT's bits: checked once per process
    on channels ORT treats specially (all zero, one-signed, subnormal, wide), in every
    integer type, symmetric or not, with and without reduce_range. ORT's arithmetic has
    changed between releases (ORT 1.32 subtracts the range in float64, after a comment
    on overflow); where it differs, ORT's own loops run."""
    from onnxruntime.quantization.quant_utils import compute_data_quant_params, quantize_nparray

    rng = np.random.default_rng(0)
    data = rng.normal(0, 0.2, size=(6, 40)).astype(np.float32)
    data[0], data[1], data[2] = 0.0, np.abs(data[1]), -np.abs(data[2])
    data[3], data[4] = 1e-42, data[4] * 1000.0
    try:
        for quant_type in _PLAIN_TYPES:
            for symmetric in (True, False):
                for reduce_range in (False, True):
                    zps, scales = channel_params(data, 0, quant_type, symmetric, reduce_range)
                    values = quantize_channels(data, 0, zps, scales, quant_type)
                    for i, row in enumerate(data):
                        zp, scale = compute_data_quant_params(
                            row, quant_type, symmetric, reduce_range
                        )
                        want = quantize_nparray(quant_type, row, scale, zp)
                        got = (zps[i : i + 1], scales[i : i + 1], values[i])
                        for ort_array, ours in zip((zp, scale, want), got, strict=True):
                            if ort_array.dtype != ours.dtype or (
                                np.asarray(ort_array).tobytes() != ours.tobytes()
                            ):
                                return False
    except Exception:  # an ORT whose functions take other arguments
        return False
    return True


def active() -> bool:
    """Whether this context is inside :func:`vectorized`: a QDQ weight's values then come
    from :func:`quantized_initializer` (see
    :func:`lpq_onnxrt.passes.quantizer.patch_quantize_onnx_initializer`)."""
    return _ON.get()


def _wrap_qdq_params(quantizer: Any) -> None:
    """QDQ: the scales and zero points of plain per-channel weights, the rest by ORT."""
    from onnx import numpy_helper
    from onnxruntime.quantization.base_quantizer import QuantizationParams
    from onnxruntime.quantization.qdq_quantizer import QDQQuantTensorType

    original = quantizer._calc_initializer_quant_params

    def calc() -> dict[str, Any]:
        every = quantizer.tensors_to_quantize
        initializers = {init.name: init for init in quantizer.model.initializer()}
        done: dict[str, Any] = {}
        for name, info in every.items():
            init = initializers.get(name)
            is_weight = info.tensor_type is QDQQuantTensorType.WEIGHT
            if init is None or (is_weight and quantizer.block_size > 0):
                continue
            settings = _settings(
                quantizer,
                init,
                quantizer.weight_qType if is_weight else quantizer.activation_qType,
                info.axis,
                True,  # ORT quantizes every per-channel initializer symmetrically
                quantizer.reduce_range,
            )
            if settings is not None:
                quant_type, axis, symmetric, reduce_range = settings
                zero_points, scales = channel_params(
                    numpy_helper.to_array(init), axis, quant_type, symmetric, reduce_range
                )
                done[name] = QuantizationParams(
                    zero_point=zero_points, scale=scales, quant_type=quant_type, axis=axis
                )
        if len(done) < len(every):
            quantizer.tensors_to_quantize = {n: i for n, i in every.items() if n not in done}
            try:
                done.update(original())
            finally:
                quantizer.tensors_to_quantize = every
        return {name: done[name] for name in every if name in done}

    quantizer._calc_initializer_quant_params = calc


def _wrap_qoperator(quantizer: Any) -> None:
    """QOperator and dynamic: a plain per-channel weight's scale, zero point and
    quantized initializers, as ORT's ``quantize_weight_per_channel_impl`` adds them."""
    import onnx
    from onnx import numpy_helper

    original = quantizer.quantize_weight_per_channel_impl

    def impl(
        weight_name: str,
        weight_qType: Any,
        channel_axis: int,
        reduce_range: bool = True,
        keep_float_weight: bool = False,
    ) -> tuple[str, str, str]:
        init = quantizer.model.get_initializer(weight_name)
        entry = _entry(quantizer, weight_name)
        settings = None
        if (
            init is not None
            and -len(init.dims) <= channel_axis < len(init.dims)
            and entry is not None
            and (not entry or "axis" in entry)  # ORT reads an override's axis
        ):
            settings = _settings(
                quantizer,
                init,
                weight_qType,
                channel_axis,
                None,  # the symmetry of the type an override names, as ORT
                quantizer.reduce_range and reduce_range,
            )
        if init is None or settings is None or settings[1] != channel_axis % len(init.dims):
            return original(
                weight_name, weight_qType, channel_axis, reduce_range, keep_float_weight
            )
        weight_qType, axis, symmetric, reduce_range = settings
        data = numpy_helper.to_array(init)
        zero_points, scales = channel_params(data, axis, weight_qType, symmetric, reduce_range)
        names = (weight_name + "_quantized", weight_name + "_zero_point", weight_name + "_scale")
        count = [data.shape[axis]]
        quantizer.model.initializer_extend(
            [
                onnx.helper.make_tensor(names[2], init.data_type, count, scales.tolist()),
                onnx.helper.make_tensor(names[1], weight_qType, count, zero_points.tolist()),
            ]
        )
        if not keep_float_weight:
            values = quantize_channels(data, axis, zero_points, scales, weight_qType)
            quantizer.model.initializer_extend([numpy_helper.from_array(values, names[0])])
        return names

    quantizer.quantize_weight_per_channel_impl = impl


def _rows(data: np.ndarray, axis: int) -> np.ndarray:
    """``data`` as one row per channel along ``axis``."""
    moved = np.moveaxis(data, axis, 0)
    return moved.reshape(moved.shape[0], -1)


def _plain_array(data: np.ndarray) -> bool:
    return data.dtype == np.float32 and data.ndim > 0 and data.size > 0


#: The override keys :func:`_settings` applies; a tensor overridden with others (its
#: range, its scale and zero point, per-channel lists) goes to ORT.
_SIMPLE_OVERRIDES = {"quant_type", "axis", "symmetric", "reduce_range"}


def _entry(quantizer: Any, name: str) -> dict[str, Any] | None:
    """Tensor ``name``'s override (``{}`` for none) where it is plain settings only;
    None where ORT must read it."""
    helper = getattr(quantizer, "tensor_quant_overrides", None)
    overrides = getattr(helper, "overrides", None)
    if not isinstance(overrides, dict):
        return None
    entries = overrides.get(name) or [{}]
    if len(entries) != 1 or not set(entries[0]) <= _SIMPLE_OVERRIDES:
        return None
    return dict(entries[0])


def _settings(
    quantizer: Any,
    tensor: onnx.TensorProto,
    quant_type: int,
    axis: int | None,
    symmetric: bool | None,
    reduce_range: bool,
) -> tuple[int, int, bool, bool] | None:
    """The quant type, channel axis (normalized), symmetry and reduce_range ORT uses
    for ``tensor``: the given defaults with the tensor's plain overrides applied
    (``symmetric`` None: the quant type's own). None where this module leaves the
    tensor to ORT: not a float32 tensor with values in every channel, not per-channel,
    an override it does not apply, ``MinimumRealRange``, an axis ORT rejects, a type
    other than 8- or 16-bit integers."""
    entry = _entry(quantizer, tensor.name)
    rank = len(tensor.dims)
    if entry is None or quantizer.min_real_range is not None:
        return None
    if tensor.data_type != 1 or rank == 0 or not all(d > 0 for d in tensor.dims):
        return None  # float16 scales and ORT's rule for empty channels stay ORT's
    if "quant_type" in entry:
        quant_type = getattr(entry["quant_type"], "tensor_type", -1)
    axis = entry.get("axis", axis)
    if quant_type not in _PLAIN_TYPES or axis is None or not -rank <= axis < rank:
        return None
    if "symmetric" in entry:
        symmetric = bool(entry["symmetric"])
    elif symmetric is None:
        symmetric = bool(quantizer.is_weight_symmetric(quant_type))
    return quant_type, axis % rank, symmetric, bool(entry.get("reduce_range", reduce_range))
