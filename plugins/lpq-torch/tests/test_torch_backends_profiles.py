"""Every shipped backend profile, end to end on real models: the scheme's constraints hold
in the simulation, PTQ + deploy works, the exported QDQ model run in ONNX Runtime matches
the simulation within one quantization step, and the parameter files hold the simulated
parameters."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch_testmodels import calib_loader, digits, eval_loader

import lpq
from lpq.cli.deploy import deploy
from lpq_torch.backends import simulate, verify
from lpq_torch.backends.params import TENSORRT_CACHE_HEADER, read_qdq
from lpq_torch.backends.profiles import PROFILES, scheme_of

BACKENDS = list(PROFILES)


class SmallResNet(nn.Module):
    """conv-bn-relu, a residual block, a depthwise conv with ReLU6, global pooling, linear:
    the patterns whose placement differs between backends (fusion, add, pooling)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.depthwise = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6()
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(x + self.bn2(self.conv2(y)))
        x = self.depthwise(x)
        return self.head(torch.flatten(self.pool(x), 1))


@pytest.fixture(scope="module")
def small_resnet() -> nn.Module:
    torch.manual_seed(0)
    model = SmallResNet()
    with torch.no_grad():  # non-trivial batch-norm statistics, so folding matters
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model.eval()


def batches() -> list[np.ndarray]:
    images, _ = digits("test")
    return [images[:128]]


@pytest.fixture(scope="module")
def deployed(small_resnet: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each profile deployed once for the small ResNet (shared by the checks below)."""
    return {
        backend: deploy(small_resnet, backend, tmp_path_factory.mktemp(backend), calib_loader())
        for backend in BACKENDS
    }


def quantizer_nodes(sim: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, Any]]:
    found = []
    for node in sim.graph.nodes:
        if node.op == "call_module":
            module = sim.get_submodule(str(node.target))
            if isinstance(module, simulate.FakeQuantizer):
                found.append((node, module))
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_scheme_constraints_hold_in_the_simulation(deployed: dict[str, Any], backend: str) -> None:
    sim = deployed[backend].model
    scheme = scheme_of(backend)
    nodes = quantizer_nodes(sim)
    assert nodes
    for node, q in nodes:
        weight = node.args[0].op == "get_attr"
        rule = scheme.weight if weight else scheme.activation
        assert (q.spec.qmin, q.spec.qmax) == rule.quant_range(), node.name
        scale = q.scale.reshape(-1)
        if not weight or rule.granularity == "per_tensor" or node.name.startswith("bq"):
            assert scale.numel() == 1, f"{node.name}: per-tensor"
        else:
            assert scale.numel() > 1, f"{node.name}: per-channel"
        if rule.symmetric and rule.signed:
            assert torch.all(q.zero_point == 0), f"{node.name}: symmetric"
        if rule.scale == "pow2":
            assert torch.all(torch.log2(scale) == torch.round(torch.log2(scale))), node.name
        assert q.spec.rounding == rule.rounding
    # Placement: where the scheme quantizes.
    last = next(n for n in sim.graph.nodes if n.op == "output").args[0][0]
    if scheme.placement == "outputs":
        assert last.op == "call_module", "every tensor, the output too, is quantized"
    else:
        assert last.op == "call_function", "TensorRT/OpenVINO keep the last op's output float"
        add = next(n for n in sim.graph.nodes if simulate.short_name(n) == "add")
        quantized_inputs = [
            a for a in add.args if isinstance(a, torch.fx.Node) and a.op == "call_module"
        ]
        assert bool(quantized_inputs) == ("add" in scheme.quantize_inputs_of)
    if scheme.bias == "int32":
        assert simulate.bias_quantizers(sim) and all(
            b.active for b in simulate.bias_quantizers(sim).values()
        )
    assert not any(simulate.short_name(n) == "batch_norm" for n in sim.graph.nodes), "folded"


@pytest.mark.parametrize("backend", BACKENDS)
def test_onnx_runtime_matches_the_simulation_within_one_step(
    deployed: dict[str, Any], backend: str
) -> None:
    result = deployed[backend]
    assert_faithful(result, batches(), backend)


def assert_faithful(result: Any, inputs: list[np.ndarray], backend: str) -> None:
    """The proof: ONNX Runtime's run of the exported model against the simulation."""
    # 1. model.onnx with ONNX's rounding in the simulation: identical integer codes at
    #    every quantizer and every output within one step (float summation order): the QDQ
    #    nodes encode the simulated scales, zero points, ranges and placement exactly.
    even = verify.compare(result.model, result.onnx_model, inputs, round_mode="half_even")
    assert even["max_code_diff"] == 0.0, even["tensors"]
    assert even["max_steps"] <= 1.0 + 1e-4, even["outputs"]
    # 2. The same export with the backend's rounding written from standard ops (ONNX's
    #    QuantizeLinear can only round half to even): the simulation itself, bit for bit.
    exact_model = lpq.get_plugin_manager().convert(
        "torch", result.model, "onnx", {"exact_rounding": True}
    )
    exact = verify.compare(result.model, exact_model, inputs)
    assert exact["max_code_diff"] == 0.0, exact["tensors"]
    assert exact["max_steps"] <= 1.0 + 1e-4, exact["outputs"]
    # 3. model.onnx against the backend's rounding: each QuantizeLinear, given the same
    #    input, differs from the backend only on exact ties (Vitis AI, TFLite), by one code.
    own = verify.compare(result.model, result.onnx_model, inputs)
    rounding = scheme_of(backend).activation.rounding
    assert own["max_code_diff"] <= (0.0 if rounding == "half_even" else 1.0), own["tensors"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_qdq_model_encodes_the_simulated_parameters(
    deployed: dict[str, Any], backend: str
) -> None:
    result = deployed[backend]
    entries = read_qdq(result.onnx_model)
    summary = json.loads(result.path("quantization.json").read_text())["tensors"]
    for node, q in quantizer_nodes(result.model):
        source = node.args[0]
        if source.op == "get_attr":
            consumer = next(iter(node.users))
            key = lpq_op_name(consumer) + (".weight" if consumer.args[1] is node else ".bias")
        else:
            key = source.name
        entry = entries[key]
        assert entry["scale"] == [float(v) for v in q.scale.reshape(-1)], key
        assert entry["zero_point"] == [int(v) for v in q.zero_point.reshape(-1)], key
        assert (entry["qmin"], entry["qmax"]) == (q.spec.qmin, q.spec.qmax)
        assert summary[key]["scale"] == entry["scale"]


def lpq_op_name(node: torch.fx.Node) -> str:
    return str(node.meta["custom"]["lpq_op"]).split("|")[0]


def activation_scales(sim: torch.fx.GraphModule) -> dict[str, float]:
    return {
        node.args[0].name: float(q.scale)
        for node, q in quantizer_nodes(sim)
        if node.args[0].op != "get_attr"
    }


def test_tensorrt_files_hold_the_simulated_ranges(deployed: dict[str, Any]) -> None:
    result = deployed["tensorrt"]
    scales = activation_scales(result.model)
    lines = result.path("calibration.cache").read_text().splitlines()
    assert lines[0] == TENSORRT_CACHE_HEADER
    cache = {}
    for line in lines[1:]:
        tensor, hex_scale = line.split(": ")
        cache[tensor] = struct.unpack(">f", bytes.fromhex(hex_scale))[0]
    assert cache == scales
    ranges = json.loads(result.path("dynamic_ranges.json").read_text())
    assert ranges == {t: s * 127 for t, s in scales.items()}
    # The ranges name tensors of the float model written beside them.
    import onnx

    fp32 = onnx.load(str(result.path("model_fp32.onnx")))
    names = {o for n in fp32.graph.node for o in n.output} | {i.name for i in fp32.graph.input}
    assert set(cache) <= names
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in fp32.graph.node)


def test_the_float_model_computes_the_simulation_without_activation_rounding(
    deployed: dict[str, Any],
) -> None:
    """model_fp32.onnx: same graph, weights on their grid, no activation quantization."""
    import onnxruntime as ort

    result = deployed["snpe"]
    session = ort.InferenceSession(
        str(result.path("model_fp32.onnx")), providers=["CPUExecutionProvider"]
    )
    images = batches()[0]
    fp32 = session.run(None, {"x": images})[0]
    sim = result.model
    with torch.no_grad():
        quantized = sim(torch.from_numpy(images)).numpy()
    assert np.abs(fp32 - quantized).max() < 0.5 * np.abs(quantized).max()
    assert not np.allclose(fp32, quantized)  # activation rounding is gone


def test_snpe_encodings_hold_the_simulated_parameters(deployed: dict[str, Any]) -> None:
    result = deployed["snpe"]
    data = json.loads(result.path("encodings.json").read_text())
    sim = result.model
    for node, q in quantizer_nodes(sim):
        source = node.args[0]
        if source.op == "get_attr":
            name = lpq_op_name(next(iter(node.users))) + ".weight"
            encodings = data["param_encodings"][name]
            assert [e["scale"] for e in encodings] == [float(v) for v in q.scale]
            # Signed symmetric int8 codes shift to AIMET's unsigned form: offset -128.
            assert {e["offset"] for e in encodings} == {-128}
            continue
        (encoding,) = data["activation_encodings"][source.name]
        assert encoding["bitwidth"] == 8 and encoding["scale"] == float(q.scale)
        assert encoding["offset"] == -int(q.zero_point)  # uint8 activations
        assert math.isclose(encoding["min"], -int(q.zero_point) * float(q.scale))
        assert math.isclose(encoding["max"], (255 - int(q.zero_point)) * float(q.scale))


def test_vitis_fix_points_are_the_simulated_power_of_two_scales(deployed: dict[str, Any]) -> None:
    result = deployed["vitis"]
    tensors = json.loads(result.path("fix_points.json").read_text())["tensors"]
    scales = activation_scales(result.model)
    for tensor, scale in scales.items():
        assert tensors[tensor]["bit_width"] == 8
        assert 2.0 ** -tensors[tensor]["fix_point"] == scale
    # Weights and (batch-norm-folded) biases: 8-bit fixed point too, one position each.
    for kind in ("weight", "bias"):
        constants = {k: v for k, v in tensors.items() if v["kind"] == kind}
        assert len(constants) == 5, kind
        assert all(isinstance(v["fix_point"], int) for v in constants.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_digits_cnn_deploys_and_keeps_its_accuracy(
    digits_convnet: nn.Module, backend: str, tmp_path: Path
) -> None:
    import onnxruntime as ort

    pm = lpq.get_plugin_manager()
    result = deploy(digits_convnet, backend, tmp_path, calib_loader())
    fp32 = pm.evaluate("torch", digits_convnet, eval_loader(), [lpq.TopK(1)]).accuracy
    sim = pm.evaluate("torch", result.model, eval_loader(), [lpq.TopK(1)]).accuracy
    assert sim >= fp32 - 0.02
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    images, labels = digits("test")
    onnx_accuracy = float((session.run(None, {"x": images})[0].argmax(1) == labels).mean())
    assert abs(onnx_accuracy - sim) <= 0.01
    assert_faithful(result, [images[:200]], backend)
    assert pm.quantized_ops("torch", result.model) == {
        "features.0": "int8",
        "features.3": "int8",
        "classifier.1": "int8",
        "classifier.3": "int8",
    }
