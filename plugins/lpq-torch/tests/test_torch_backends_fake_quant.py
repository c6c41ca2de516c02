"""Backend-exact fake quantization: rounding modes, scale rules, ONNX semantics, and the
gradients of the learnable quantizers (LSQ, LSQ+, PACT) against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lpq_torch.backends.fake_quant import (
    LSQ,
    PACT,
    fake_quantize,
    pow2,
    round_with,
)
from lpq_torch.backends.observers import Histogram, MinMax, Spec
from lpq_torch.backends.profiles import parse_scheme

TIES = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, -0.6])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("half_even", [-2, -2, 0, 0, 2, 2, 0, -1]),
        ("half_up", [-2, -1, 0, 1, 2, 3, 0, -1]),
        ("half_away", [-3, -2, -1, 1, 2, 3, 0, -1]),
    ],
)
def test_rounding_modes_on_ties(mode: str, expected: list[int]) -> None:
    assert round_with(TIES, mode).tolist() == expected


def spec(dtype: str = "int8", **fields: object) -> Spec:
    from lpq_torch.backends.simulate import tensor_spec

    scheme = parse_scheme({"activation": {"dtype": dtype, **fields}})
    return tensor_spec(scheme.activation, None, "test", axis=None)


def test_symmetric_signed_scale_is_amax_over_qmax() -> None:
    s = spec("int8", symmetric=True)
    scale, zero = s.qparams(torch.tensor([-3.0]), torch.tensor([1.27]))
    assert float(scale) == pytest.approx(3.0 / 127) and float(zero) == 0
    narrow = spec("int8", symmetric=True, narrow_range=True)
    assert (narrow.qmin, narrow.qmax) == (-127, 127)


def test_asymmetric_zero_point_is_an_integer_in_range() -> None:
    s = spec("uint8", symmetric=False)
    scale, zero = s.qparams(torch.tensor([-1.0]), torch.tensor([3.0]))
    assert float(scale) == pytest.approx(4.0 / 255)
    assert float(zero) == round(1.0 / float(scale)) and 0 <= float(zero) <= 255
    # A range that excludes zero is widened to include it (zero must be exact).
    scale, zero = s.qparams(torch.tensor([0.5]), torch.tensor([2.0]))
    assert float(zero) == 0 and float(scale) == pytest.approx(2.0 / 255)


def test_power_of_two_scales_and_fixed_positions() -> None:
    s = spec("int8", symmetric=True, scale="pow2")
    for amax in (0.03, 0.9, 1.0, 5.7, 100.0):
        scale, _ = s.qparams(torch.tensor([-amax]), torch.tensor([amax]))
        position = -np.log2(float(scale))
        assert position == round(position)
        assert float(scale) == float(pow2(torch.tensor(amax / 127)))
    # pow2 rounds in the log domain: 0.75 * 2^-3 -> 2^-3, 0.7 * 2^-3 -> 2^-4.
    assert float(pow2(torch.tensor(0.75 / 8))) == 1 / 8
    assert float(pow2(torch.tensor(0.70 / 8))) == 1 / 16


def test_seven_bit_weights_never_leave_their_range() -> None:
    s = spec("int8", symmetric=True, narrow_range=True, reduce_range=True)
    assert (s.qmin, s.qmax) == (-63, 63)
    x = torch.linspace(-2, 2, 1001)
    scale, zero = s.qparams(x.min().reshape(1), x.max().reshape(1))
    codes = torch.round(fake_quantize(x, scale, zero, s.qmin, s.qmax) / scale)
    assert codes.min() == -63 and codes.max() == 63


def test_fake_quantize_is_onnx_quantize_dequantize() -> None:
    """Same numbers as ONNX Runtime's QuantizeLinear -> DequantizeLinear (half to even)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4000) * 3).astype(np.float32)
    x[:8] = np.array([0.5, 1.5, -0.5, -2.5, 2.5, 3.5, 100.0, -100.0], np.float32) * 0.05
    scale, zero = np.float32(0.05), np.uint8(128)
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        [
            helper.make_tensor("s", TensorProto.FLOAT, [], [scale]),
            helper.make_tensor("z", TensorProto.UINT8, [], [zero]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"x": x})[0]
    mine = fake_quantize(
        torch.from_numpy(x), torch.tensor([0.05]), torch.tensor([128.0]), 0, 255
    ).numpy()
    np.testing.assert_array_equal(mine, theirs)


def test_observers_stream_and_pick_ranges() -> None:
    s = spec("uint8", symmetric=False)
    minmax, hist = MinMax(s), Histogram(s, percentile=99.0)
    torch.manual_seed(0)
    for _ in range(5):
        batch = torch.randn(2000)
        minmax.observe(batch)
        hist.observe(batch)
    hist.observe(torch.tensor([50.0]))  # one outlier stretches the range ...
    _low, high = hist.percentile_range()
    assert float(high) < 5.0 < float(hist.range()[1])  # ... the percentile ignores it
    assert hist.counts.sum() == 10001  # nothing lost re-binning
    _mse_low, mse_high = hist.mse_range()
    assert float(mse_high) < 50.0


def test_mse_search_uses_the_backends_own_quantizer() -> None:
    s = spec("int8", symmetric=True, scale="pow2")
    hist = Histogram(s)
    hist.observe(torch.randn(20000) * 0.3)
    scale, _ = s.qparams(*hist.mse_range())
    assert np.log2(float(scale)) == round(np.log2(float(scale)))


# ---------------------------------------------------------------------- gradients


def _surrogate_lsq(x, scale, zero, x0, s0, z0, qmin, qmax):
    """LSQ's function with the rounding residual frozen at (x0, s0, z0): its exact
    derivative is LSQ's straight-through gradient."""
    v0 = x0 / s0 + torch.round(z0)
    residual = torch.clamp(torch.round(x0 / s0) + torch.round(z0), qmin, qmax) - torch.clamp(
        v0, qmin, qmax
    )
    z_ste = zero + (torch.round(z0) - z0)
    v = x / scale + z_ste
    return (torch.clamp(v, qmin, qmax) + residual - z_ste) * scale


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("learn_zero", [False, True])
def test_lsq_gradients_match_finite_differences(per_channel: bool, learn_zero: bool) -> None:
    torch.manual_seed(1)
    qmin, qmax = (0, 15) if learn_zero else (-8, 7)
    x = torch.randn(6, 5, dtype=torch.float64) * 2
    channels = 6 if per_channel else 1
    scale = (torch.rand(channels, dtype=torch.float64) * 0.3 + 0.2).requires_grad_()
    zero = (
        torch.full((channels,), 4.3 if learn_zero else 0.0, dtype=torch.float64)
    ).requires_grad_()
    xg = x.clone().requires_grad_()
    axis = 0 if per_channel else None
    weights = torch.randn(6, 5, dtype=torch.float64)  # a random upstream gradient
    out = LSQ.apply(xg, scale, zero, qmin, qmax, "half_even", axis, 1.0)
    (out * weights).sum().backward()

    def loss(xv, sv, zv):
        view = (lambda t: t.reshape(-1, 1)) if per_channel else (lambda t: t.reshape(()))
        return (
            _surrogate_lsq(
                xv, view(sv), view(zv), x, view(scale.detach()), view(zero.detach()), qmin, qmax
            )
            * weights
        ).sum()

    eps = 1e-6
    for name, param, grad in (
        ("x", x, xg.grad),
        ("scale", scale.detach(), scale.grad),
        ("zero", zero.detach(), zero.grad),
    ):
        numeric = torch.zeros_like(param)
        flat = numeric.reshape(-1)
        for i in range(param.numel()):
            up, down = param.clone().reshape(-1), param.clone().reshape(-1)
            up[i] += eps
            down[i] -= eps
            args = {"x": x, "scale": scale.detach(), "zero": zero.detach()}
            args[name] = up.reshape(param.shape)
            high = loss(args["x"], args["scale"], args["zero"])
            args[name] = down.reshape(param.shape)
            low = loss(args["x"], args["scale"], args["zero"])
            flat[i] = (high - low) / (2 * eps)
        torch.testing.assert_close(grad, numeric, atol=1e-5, rtol=1e-5, msg=f"d/d{name}")
    # The forward value is plain fake quantization.
    torch.testing.assert_close(
        out, fake_quantize(x, scale.detach(), torch.round(zero.detach()), qmin, qmax, axis=axis)
    )


@pytest.mark.parametrize("symmetric", [True, False])
def test_pact_gradients_match_finite_differences(symmetric: bool) -> None:
    torch.manual_seed(2)
    qmin, qmax = (-8, 7) if symmetric else (0, 15)
    x = torch.randn(40, dtype=torch.float64) * 2
    alpha = torch.tensor([1.7], dtype=torch.float64, requires_grad=True)
    xg = x.clone().requires_grad_()
    weights = torch.randn(40, dtype=torch.float64)
    out = PACT.apply(xg, alpha, qmin, qmax, "half_even", symmetric, False)
    (out * weights).sum().backward()
    low = -1 if symmetric else 0

    def surrogate(xv, a):  # PACT's STE: the rounding offset is a constant
        clipped0 = torch.clamp(x, low * alpha.detach(), alpha.detach())
        offset = out.detach() - clipped0
        return ((torch.maximum(torch.minimum(xv, a), low * a) + offset) * weights).sum()

    eps = 1e-6
    numeric_alpha = (surrogate(x, alpha.detach() + eps) - surrogate(x, alpha.detach() - eps)) / (
        2 * eps
    )
    torch.testing.assert_close(alpha.grad, numeric_alpha.reshape(1), atol=1e-6, rtol=1e-6)
    numeric_x = torch.zeros_like(x)
    for i in range(x.numel()):
        up, down = x.clone(), x.clone()
        up[i] += eps
        down[i] -= eps
        numeric_x[i] = (surrogate(up, alpha.detach()) - surrogate(down, alpha.detach())) / (2 * eps)
    torch.testing.assert_close(xg.grad, numeric_x, atol=1e-6, rtol=1e-6)
    assert float(out.detach().max()) <= 1.7 + 1e-12
    assert float(out.detach().min()) >= low * 1.7 - 1e-12


def test_lsq_learns_a_scale_that_lowers_the_error() -> None:
    """A few steps of LSQ on the quantization error move the scale the right way."""
    torch.manual_seed(3)
    x = torch.randn(4096)
    scale = torch.tensor([0.5], requires_grad=True)  # far too coarse for 4 bits
    zero = torch.zeros(1)
    optimizer = torch.optim.Adam([scale], lr=0.02)
    errors = []
    for _ in range(30):
        optimizer.zero_grad()
        out = LSQ.apply(x, scale, zero, -8, 7, "half_even", None, 1.0 / (4096 * 7) ** 0.5)
        error = ((out - x) ** 2).mean()
        error.backward()
        optimizer.step()
        errors.append(float(error.detach()))
    assert errors[-1] < 0.8 * errors[0]
