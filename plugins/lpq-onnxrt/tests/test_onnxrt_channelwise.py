"""Per-channel weights quantized in whole arrays (``passes.channelwise``): the same
scales, zero points and values as ORT's loop over channels, bit for bit, and builds
byte-identical to ORT's own in the QDQ, QOperator and dynamic passes."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto


def _weights(axis: int) -> np.ndarray:
    """Random conv-shaped weights with the channels ORT treats specially along
    ``axis``: all zero (its degenerate scale), all positive, all negative, subnormal,
    and wide."""
    rng = np.random.default_rng(0)
    data = rng.normal(0, 0.2, size=(9, 7, 5, 6)).astype(np.float32)
    moved = np.moveaxis(data, axis, 0)
    moved[0] = 0.0
    moved[1] = np.abs(moved[1])
    moved[2] = -np.abs(moved[2])
    moved[3] = 1e-42  # subnormal: a scale under float32's smallest normal
    moved[4] *= 1000.0
    return data


def _ort_channels(
    data: np.ndarray, axis: int, qtype: int, symmetric: bool, reduce_range: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ORT's loop: each channel's zero point, scale and values."""
    from onnxruntime.quantization.quant_utils import compute_data_quant_params, quantize_nparray

    zps, scales, values = [], [], []
    for i in range(data.shape[axis]):
        channel = data.take(i, axis).ravel()
        zp, scale = compute_data_quant_params(channel, qtype, symmetric, reduce_range)
        zps.append(zp)
        scales.append(scale)
        values.append(quantize_nparray(qtype, channel, scale, zp))
    shape = list(np.moveaxis(data, axis, 0).shape)
    stacked = np.stack(values).reshape(shape)
    return np.asarray(zps), np.asarray(scales), np.moveaxis(stacked, 0, axis)


@pytest.mark.parametrize("axis", [0, 1, 3])
@pytest.mark.parametrize(
    "qtype", [TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16]
)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_channels_match_orts_loop_bit_for_bit(axis, qtype, symmetric, reduce_range):
    from lpq_onnxrt.passes.channelwise import channel_params, quantize_channels

    data = _weights(axis)
    want_zp, want_scale, want_values = _ort_channels(data, axis, qtype, symmetric, reduce_range)
    zp, scale = channel_params(data, axis, qtype, symmetric, reduce_range)
    assert zp.dtype == want_zp.dtype and scale.dtype == want_scale.dtype
    assert zp.tobytes() == want_zp.tobytes()
    assert scale.tobytes() == want_scale.tobytes()
    values = quantize_channels(data, axis, zp, scale, qtype)
    assert values.dtype == want_values.dtype and values.shape == data.shape
    assert values.tobytes() == want_values.tobytes()
    # the planted channels did reach ORT's special cases
    assert scale[0] == 1.0 and zp[0] == 0  # all zero: degenerate
    assert len(set(want_values.take(4, axis).ravel().tolist())) > 10


@pytest.fixture
def parts(digits_static: dict[str, Any]) -> dict[str, Any]:
    cfg = digits_static["cfg"]
    ops = {n: c for (n, _), c in cfg.ops.items() if c.quantized}
    return {
        "model": digits_static["prepared"].model,
        "cfg": cfg,
        "stats": digits_static["stats"],
        "ops": ops,
    }


class _CountedLoops:
    """Counts ORT's per-channel calls: ``quantize_nparray`` (each channel's values) and
    ``compute_data_quant_params`` (each channel's scale), wherever ORT's modules call
    them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from onnxruntime.quantization import base_quantizer, qdq_quantizer, quant_utils

        from lpq_onnxrt.passes.channelwise import agrees_with_ort

        agrees_with_ort()  # its once-per-process check calls ORT's functions: not counted
        self.calls = 0
        for module in (quant_utils, base_quantizer, qdq_quantizer):
            for name in ("quantize_nparray", "compute_data_quant_params", "quantize_data"):
                original = getattr(module, name, None)
                if original is not None:
                    monkeypatch.setattr(module, name, self._counted(original))

    def _counted(self, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        return counted


def _static(parts: dict[str, Any], fmt: str, cache: Any = None) -> bytes:
    from lpq_onnxrt import model_io
    from lpq_onnxrt.passes.static import static_pass

    built, _ = static_pass(
        model_io.copy_model(parts["model"]),
        parts["ops"],
        parts["cfg"],
        parts["stats"],
        fmt,
        weight_cache=cache,
    )
    return bytes(built.SerializeToString())


def _plain(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    monkeypatch.setattr(module, "vectorized", lambda _: contextlib.nullcontext())


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
@pytest.mark.parametrize("cached", [False, True])
def test_static_builds_are_byte_identical_and_skip_orts_loops(parts, fmt, cached, monkeypatch):
    from lpq_onnxrt.passes import quantizer, static

    counted = _CountedLoops(monkeypatch)
    fast = _static(parts, fmt, quantizer.WeightCache() if cached else None)
    fast_calls = counted.calls
    with monkeypatch.context() as patch:
        _plain(patch, static)
        counted.calls = 0
        plain = _static(parts, fmt, quantizer.WeightCache() if cached else None)
    assert fast == plain
    # ORT's loop runs once per channel of each per-channel weight: hundreds here
    assert counted.calls > 100 and fast_calls < counted.calls / 10


def test_dynamic_builds_are_byte_identical(mlp_model, monkeypatch):
    from lpq import TensorConfig
    from lpq_onnxrt.passes import dynamic

    weight = TensorConfig(dtype="int8", scheme="sym", granularity="per_channel")
    names = [n.name for n in mlp_model.graph.node if n.op_type == "MatMul"]
    assert names
    counted = _CountedLoops(monkeypatch)
    fast = dynamic._quantize_dynamic(
        onnx.ModelProto.FromString(mlp_model.SerializeToString()), weight, names
    )
    fast_calls = counted.calls
    with monkeypatch.context() as patch:
        _plain(patch, dynamic)
        counted.calls = 0
        plain = dynamic._quantize_dynamic(
            onnx.ModelProto.FromString(mlp_model.SerializeToString()), weight, names
        )
    assert fast.SerializeToString() == plain.SerializeToString()
    assert counted.calls > 100 and fast_calls < counted.calls / 10


class _Quantizer:
    """What :func:`channelwise._settings` reads of an ORT quantizer."""

    def __init__(self, overrides: dict[str, list[dict[str, Any]]], min_real_range: Any = None):
        from onnxruntime.quantization.tensor_quant_overrides import TensorQuantOverridesHelper

        self.tensor_quant_overrides = TensorQuantOverridesHelper(overrides)
        self.min_real_range = min_real_range

    @staticmethod
    def is_weight_symmetric(qtype: int) -> bool:
        return qtype == TensorProto.INT8


def test_overrides_other_than_plain_settings_are_left_to_ort():
    from onnxruntime.quantization import QuantType

    from lpq_onnxrt.passes.channelwise import _settings

    weight = onnx.helper.make_tensor("w", TensorProto.FLOAT, [4, 3], np.ones(12).tolist())
    settings = _settings(
        _Quantizer({"w": [{"quant_type": QuantType.QUInt8, "axis": -1, "reduce_range": True}]}),
        weight,
        TensorProto.INT8,
        0,
        None,
        False,
    )
    assert settings == (TensorProto.UINT8, 1, False, True)
    assert _settings(_Quantizer({}), weight, TensorProto.INT8, 0, None, False) == (
        TensorProto.INT8,
        0,
        True,
        False,
    )
    for quantizer, axis in [
        (_Quantizer({"w": [{"axis": 0, "rmin": -1.0}]}), 0),  # a range: ORT's
        (_Quantizer({"w": [{"axis": 0}, {"axis": 0}, {"axis": 0}, {"axis": 0}]}), 0),
        (_Quantizer({}, min_real_range=0.001), 0),
        (_Quantizer({}), None),  # per tensor
        (_Quantizer({}), 2),  # an axis ORT rejects
        (_Quantizer({"w": [{"quant_type": QuantType.QInt4, "axis": 0}]}), 0),
    ]:
        assert _settings(quantizer, weight, TensorProto.INT8, axis, None, False) is None
    half = onnx.helper.make_tensor("w", TensorProto.FLOAT16, [4, 3], np.ones(12).tolist())
    assert _settings(_Quantizer({}), half, TensorProto.INT8, 0, None, False) is None


def test_ort_functions_are_patched_once_per_process(parts):
    """Builds with and without a weight cache leave one patch of ORT's
    ``quantize_onnx_initializer`` in place (patches stacked per build recursed)."""
    from onnxruntime.quantization import qdq_quantizer

    from lpq_onnxrt.passes.quantizer import WeightCache

    _static(parts, "qdq", WeightCache())
    installed = qdq_quantizer.quantize_onnx_initializer
    for cache in (None, WeightCache(), WeightCache()):
        _static(parts, "qdq", cache)
    assert qdq_quantizer.quantize_onnx_initializer is installed


def test_an_ort_with_other_arithmetic_keeps_its_own_loops(parts, monkeypatch):
    """Where the installed ORT computes other bits (here: every scale one float32 step
    up), the check made once per process says so and ORT's own loops run."""
    from onnxruntime.quantization import quant_utils

    from lpq_onnxrt.passes import channelwise

    original = quant_utils.compute_data_quant_params

    def float32_range(data: Any, quant_type: Any, symmetric: Any, *args: Any, **kw: Any) -> Any:
        zero_point, scale = original(data, quant_type, symmetric, *args, **kw)
        return zero_point, np.array(np.nextafter(scale, np.float32(np.inf)), dtype=scale.dtype)

    assert channelwise.agrees_with_ort()
    monkeypatch.setattr(quant_utils, "compute_data_quant_params", float32_range)
    channelwise.agrees_with_ort.cache_clear()
    try:
        assert not channelwise.agrees_with_ort()
        counted = _CountedLoops(monkeypatch)
        _static(parts, "qoperator")
        assert counted.calls > 100  # ORT's loops ran
    finally:
        channelwise.agrees_with_ort.cache_clear()
