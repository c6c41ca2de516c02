"""MatMulNBits packing (lpq.weight_only.packing), checked against ONNX Runtime itself."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from lpq.errors import DataError
from lpq.weight_only import (
    dequantize_matmulnbits,
    pack_matmulnbits,
    quantize_rtn,
    unpack_matmulnbits,
)
from lpq.weight_only.packing import MatMulNBitsWeights

CASES = [
    (bits, sym, k)
    for bits in (4, 8)
    for sym in (True, False)
    for k in (64, 80, 23)  # a multiple of the block, one and a half blocks, less than one block
]


def _reference_dequantize(p: MatMulNBitsWeights) -> np.ndarray:
    """Element by element, straight from the spec: no reshapes shared with the code."""
    nb = math.ceil(p.k / p.block_size)
    flat_b = p.b.reshape(-1)
    flat_s = p.scales.reshape(-1)
    flat_z = None if p.zero_points is None else p.zero_points.reshape(-1)
    zp_bytes = math.ceil(nb * p.bits / 8)
    blob = p.block_size * p.bits // 8
    out = np.zeros((p.k, p.n), dtype=np.float32)
    for n in range(p.n):
        for kk in range(p.k):
            blk, pos = divmod(kk, p.block_size)
            byte_index = n * nb * blob + blk * blob + pos * p.bits // 8
            byte = int(flat_b[byte_index])
            code = byte if p.bits == 8 else (byte >> (4 * (pos % 2))) & 0xF
            if flat_z is None:
                zp = 2 ** (p.bits - 1)
            elif p.bits == 8:
                zp = int(flat_z[n * zp_bytes + blk])
            else:
                zp = (int(flat_z[n * zp_bytes + blk // 2]) >> (4 * (blk % 2))) & 0xF
            out[kk, n] = (code - zp) * flat_s[n * nb + blk]
    return out


@pytest.mark.parametrize(("bits", "symmetric", "k"), CASES)
def test_pack_round_trip_and_reference(bits: int, symmetric: bool, k: int) -> None:
    rng = np.random.default_rng(k + bits)
    w = rng.standard_normal((k, 6)).astype(np.float32)
    q = quantize_rtn(w, bits=bits, block_size=16, symmetric=symmetric)
    p = pack_matmulnbits(q)
    nb = math.ceil(k / 16)
    assert p.b.shape == (6, nb, 16 * bits // 8) and p.b.dtype == np.uint8
    assert p.scales.shape == (6, nb)
    if symmetric:
        assert p.zero_points is None
    else:
        assert p.zero_points is not None
        assert p.zero_points.shape == (6, math.ceil(nb * bits / 8))
    back = unpack_matmulnbits(p.b, p.scales, p.zero_points, k, 6, bits, 16)
    np.testing.assert_array_equal(back.codes, q.codes)
    np.testing.assert_array_equal(back.scales, q.scales)
    np.testing.assert_array_equal(back.zero_points, q.zero_points)
    deq = dequantize_matmulnbits(p.b, p.scales, p.zero_points, k, 6, bits, 16)
    np.testing.assert_array_equal(deq, q.dequantize())
    np.testing.assert_allclose(deq, _reference_dequantize(p), rtol=0, atol=1e-6)
    # ORT also accepts flattened scales and zero points.
    flat_z = None if p.zero_points is None else p.zero_points.reshape(-1)
    flat = dequantize_matmulnbits(p.b, p.scales.reshape(-1), flat_z, k, 6, bits, 16)
    np.testing.assert_array_equal(flat, deq)


def test_low_nibble_holds_the_even_index() -> None:
    w = np.zeros((16, 1), dtype=np.float32)
    q = quantize_rtn(w, bits=4, block_size=16, symmetric=False)
    codes = q.codes.copy()
    codes[0, 0], codes[1, 0] = 3, 12
    q2 = type(q)(codes, q.scales, q.zero_points, 4, 16, False)
    p = pack_matmulnbits(q2)
    assert p.b[0, 0, 0] == 3 | (12 << 4)


def test_symmetric_with_non_default_zero_points_refuses_to_drop_them() -> None:
    q = quantize_rtn(np.linspace(0, 1, 64).reshape(32, 2), bits=4, block_size=16, symmetric=False)
    with pytest.raises(DataError, match="needs its zero_points input"):
        pack_matmulnbits(q, with_zero_points=False)


def test_unpack_rejects_wrong_shapes() -> None:
    q = quantize_rtn(np.ones((32, 4)), bits=4, block_size=16, symmetric=False)
    p = pack_matmulnbits(q)
    with pytest.raises(DataError, match="N, n_blocks, blob_size"):
        unpack_matmulnbits(p.b, p.scales, p.zero_points, 32, 4, 4, 32)
    with pytest.raises(DataError, match="scales must hold"):
        unpack_matmulnbits(p.b, p.scales[:2], p.zero_points, 32, 4, 4, 16)
    assert p.zero_points is not None
    with pytest.raises(DataError, match="float zero points"):
        unpack_matmulnbits(p.b, p.scales, p.zero_points.astype(np.float32), 32, 4, 4, 16)


def _ort_session(p: MatMulNBitsWeights) -> Any:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(p.b, "B"), numpy_helper.from_array(p.scales, "scales")]
    inputs = ["A", "B", "scales"]
    if p.zero_points is not None:
        inits.append(numpy_helper.from_array(p.zero_points, "zero_points"))
        inputs.append("zero_points")
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        ["Y"],
        domain="com.microsoft",
        accuracy_level=0,
        **p.attributes(),
    )
    graph = helper.make_graph(
        [node],
        "matmulnbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, p.k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, p.n])],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # pragma: no cover - depends on the installed build
        if "MatMulNBits" in str(exc) and "not" in str(exc).lower():
            pytest.skip(f"this onnxruntime has no com.microsoft MatMulNBits: {exc}")
        raise


@pytest.mark.parametrize(("bits", "symmetric", "k"), CASES)
def test_onnxruntime_matmulnbits_matches_numpy(bits: int, symmetric: bool, k: int) -> None:
    rng = np.random.default_rng(100 + k + bits)
    n = 12
    w = rng.standard_normal((k, n)).astype(np.float32)
    q = quantize_rtn(w, bits=bits, block_size=16, symmetric=symmetric)
    p = pack_matmulnbits(q)
    session = _ort_session(p)
    x = rng.standard_normal((5, k)).astype(np.float32)
    (y,) = session.run(None, {"A": x})
    expected = x @ dequantize_matmulnbits(p.b, p.scales, p.zero_points, k, n, bits, 16)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)
    # And it is a quantization of the original weight, not an unrelated matrix.
    assert np.max(np.abs(y - x @ w)) < np.max(np.abs(x @ w))
