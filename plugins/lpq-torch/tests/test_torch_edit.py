"""The optional hooks lpq_set_tensor and lpq_quantize_input, and compiling int8 conv1d.

Small models, real torchao quantization, the quantized model run (eagerly: compiling is
only needed by the one test about compiling).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch_testmodels import Conv1dNet

import lpq


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(16, 12)
        self.out = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def _data(shape: tuple[int, ...], batches: int = 3, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(batches)]


@pytest.fixture(scope="module")
def mlp() -> dict[str, Any]:
    """An fp32 MLP, its default int8 model and the data: built once for this module."""
    torch.manual_seed(0)
    model = TwoLinears().eval()
    data = _data((8, 16))
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", model, data)
    cfg = lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise}, 64)
    return {"model": model, "data": data, "cap": cap, "q": pm.quantize("torch", model, cfg, data)}


def _weights(model: Any, data: Any) -> dict[str, dict[str, np.ndarray]]:
    pm = lpq.get_plugin_manager()
    return pm.inspect_tensor("torch", model, data, None, "weight", 1).weights


def test_tensor_names_are_unique_and_the_same_for_fp32_and_int8(mlp: dict[str, Any]) -> None:
    fp32, int8 = _weights(mlp["model"], mlp["data"]), _weights(mlp["q"], mlp["data"])
    expected = {
        "hidden": ["hidden.weight", "hidden.bias"],
        "out": ["out.weight", "out.bias"],
    }
    assert {op: list(t) for op, t in fp32.items()} == expected
    assert {op: list(t) for op, t in int8.items()} == expected
    # For an nn.Module op the tensor name is the parameter's qualified name.
    params = dict(mlp["model"].named_parameters())
    for tensors in fp32.values():
        for name, value in tensors.items():
            np.testing.assert_array_equal(value, params[name].detach().numpy())


@pytest.mark.parametrize("which", ["fp32", "int8"])
def test_set_weight_changes_the_output_as_numpy_predicts(mlp: dict[str, Any], which: str) -> None:
    """Zeroing rows of the last Linear's weight (0 is on every int8 grid) and adding 1 to its
    bias: those outputs become the new bias, the others move by exactly 1."""
    pm = lpq.get_plugin_manager()
    model = mlp["model"] if which == "fp32" else mlp["q"]
    weights = _weights(model, mlp["data"])["out"]
    rows = [0, 2]
    weight = weights["out.weight"].copy()
    weight[rows] = 0
    bias = weights["out.bias"] + 1
    edited = pm.set_tensor("torch", model, "out.weight", weight)
    edited = pm.set_tensor("torch", edited, "out.bias", bias)
    x = mlp["data"][0]
    with torch.no_grad():
        before, after = model(x).numpy(), edited(x).numpy()
    expected = before + 1
    expected[:, rows] = bias[rows]
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-5)
    # The caller's model is unchanged.
    unchanged = _weights(model, mlp["data"])["out"]["out.weight"]
    np.testing.assert_array_equal(unchanged, weights["out.weight"])


def test_set_weight_on_fp32_is_exactly_the_matrix_product(mlp: dict[str, Any]) -> None:
    pm = lpq.get_plugin_manager()
    model = mlp["model"]
    rng = np.random.default_rng(1)
    weight = rng.normal(0, 0.3, (4, 12)).astype(np.float32)
    edited = pm.set_tensor("torch", model, "out.weight", weight)
    x = mlp["data"][0]
    with torch.no_grad():
        hidden = torch.relu(model.hidden(x)).numpy()
        got = edited(x).numpy()
    expected = hidden @ weight.T + model.out.bias.detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_set_tensor_requantizes_with_the_existing_scale(mlp: dict[str, Any]) -> None:
    pm = lpq.get_plugin_manager()
    weight = _weights(mlp["q"], mlp["data"])["hidden"]["hidden.weight"]
    rng = np.random.default_rng(0)
    # Inside the range of the old scale (values past it would clip to the extreme code).
    wanted = 0.8 * weight + rng.normal(0, 0.002, weight.shape).astype(np.float32)
    edited = pm.set_tensor("torch", mlp["q"], "hidden.weight", wanted)
    got = _weights(edited, mlp["data"])["hidden"]["hidden.weight"]
    # Per-channel scale: the step of each output channel of the old int8 weight.
    steps = np.abs(weight).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(got - wanted) <= steps * 0.51 + 1e-6)
    assert not np.array_equal(got, weight)
    # Still an int8 model, read from the graph.
    assert set(pm.quantized_ops("torch", edited).values()) == {"int8"}


def test_set_tensor_refuses_unknown_names_and_wrong_shapes(mlp: dict[str, Any]) -> None:
    pm = lpq.get_plugin_manager()
    for model in (mlp["model"], mlp["q"]):
        with pytest.raises(lpq.ModelError) as unknown:
            pm.set_tensor("torch", model, "nope.weight", np.zeros(3, np.float32))
        if model is mlp["q"]:
            assert "out.bias" in (unknown.value.hint or "")
        with pytest.raises(lpq.ModelError, match="shape"):
            pm.set_tensor("torch", model, "out.bias", np.zeros(5, np.float32))


def _quantize(values: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    q = torch.round(values / p["scale"]) + p["zero_point"]
    return q.clamp(p["quant_min"], p["quant_max"]).to(getattr(torch, p["dtype"]))


def _dequantize(values: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    return (values.double() - p["zero_point"]) * p["scale"]


def test_quantize_input_takes_and_returns_integers(mlp: dict[str, Any], tmp_path: Any) -> None:
    pm = lpq.get_plugin_manager()
    integer = pm.quantize_input("torch", mlp["q"], {})
    io = integer._lpq_io
    assert set(io) == {"input:x", "output:0"}
    assert io["input:x"]["dtype"] == "uint8" and io["output:0"]["dtype"] == "uint8"
    x = mlp["data"][1]
    xq = _quantize(x, io["input:x"])
    with torch.no_grad():
        out = integer(xq)
        # The float-in model on the same (quantized) inputs.
        reference = mlp["q"](_dequantize(xq, io["input:x"]).float())
    assert out.dtype == torch.uint8
    step = io["output:0"]["scale"]
    assert (
        float((_dequantize(out, io["output:0"]) - reference.double()).abs().max()) <= step * 1.001
    )
    # Saved and loaded, it is still an integer model with the same scales.
    loaded = pm.load_model("torch", pm.save_model("torch", integer, tmp_path / "int"))
    assert loaded._lpq_io == io
    with torch.no_grad():
        assert torch.equal(loaded(xq), out)


def test_quantize_input_options(mlp: dict[str, Any]) -> None:
    pm = lpq.get_plugin_manager()
    x = mlp["data"][1]
    float_in = pm.quantize_input("torch", mlp["q"], {"inputs": False, "dtype": "int8"})
    with torch.no_grad():
        out = float_in(x)
    assert out.dtype == torch.int8 and set(float_in._lpq_io) == {"output:0"}
    with pytest.raises(lpq.ConfigError, match="uint8"):
        pm.quantize_input("torch", mlp["q"], {"dtype": "int8"})
    with pytest.raises(lpq.ModelError):
        pm.quantize_input("torch", mlp["model"], {})  # not quantized


def test_quantize_input_says_why_when_the_first_op_stays_float(mlp: dict[str, Any]) -> None:
    pm = lpq.get_plugin_manager()
    cap = mlp["cap"]
    ops = {k: cap.default_op_config(k) for k in cap.opwise}
    ops[("hidden", "linear")] = lpq.OpConfig.fallback()
    partly = pm.quantize("torch", mlp["model"], lpq.TuneConfig(ops, 64), mlp["data"])
    with pytest.raises(lpq.ModelError) as info:
        pm.quantize_input("torch", partly, {})
    assert "'inputs': False" in (info.value.hint or "")


def test_int8_conv1d_with_stride_compiles_with_freezing_to_int8_kernels() -> None:
    """Inductor drops the stride of an int8 conv1d; lpq runs it as a conv2d. Before, the
    frozen graph gave stride-1 shapes (a Silero-VAD LSTM after it failed to broadcast)
    and lpq fell back to compiling without freezing, where nothing runs in int8."""
    from torch._dynamo.utils import counters

    from lpq_torch.evaluate import Forward

    torch.manual_seed(0)
    model = Conv1dNet(width=8).eval()
    data = _data((4, 1, 8, 8))
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", model, data)
    qmodel = pm.quantize(
        "torch", model, lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise}), data
    )
    # Inspection and set_tensor still show the 3-D conv1d weight.
    weight = _weights(qmodel, data)["conv2"]["conv2.weight"]
    assert weight.shape == (8, 8, 3)
    pm.set_tensor("torch", qmodel, "conv2.weight", weight)
    counters.clear()
    forward = Forward(qmodel)
    x = data[0]
    with torch.no_grad():
        compiled, eager = forward(((x,), {})), qmodel(x)
    assert forward.mode == "inductor+freezing"
    assert (
        counters["inductor"]["qconv_unary_lower_count"]
        + counters["inductor"].get("qconv2d_unary_lower_count", 0)
        >= 3
    )
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
