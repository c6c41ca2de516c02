"""Backend schemes as data, and how a backend profile narrows the tuning space.

Run against the scripted fake adaptor: the point is what core does with a profile's
scheme (capability ∩ backend, the report of what was ruled out, the scheme handed to the
adaptor), not a framework's arithmetic (lpq-torch's backend tests do that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq.api import fit, quantize
from lpq.config import AccuracyCriterion, PostTrainingQuantConfig, TuningCriterion
from lpq.plan.backend import QuantScheme, TensorScheme, narrow_capability
from lpq.testing.fake_adaptor import CAPABILITY_YAML, FakeAdaptorPlugin, FakeModel

EVAL = [(np.zeros((100, 1), np.float32), np.arange(100) % 10)]
CALIB = [np.zeros((100, 1), np.float32)]
OPS = [("conv1", "Conv"), ("conv2", "Conv"), ("fc", "MatMul"), ("head", "MatMul")]

#: A TensorRT-like scheme that fits the fake adaptor's uint8 activations: per-tensor
#: weights, static only, MatMul kept in float.
NPU_SCHEME: dict[str, Any] = {
    "weight": {"dtype": "int8", "symmetric": True, "granularity": "per_tensor"},
    "activation": {"dtype": "uint8", "symmetric": False},
    "placement": "inputs",
    "float_ops": ["MatMul"],
}


class ProfilePlugin:
    def __init__(self, *profiles: lpq.BackendProfile) -> None:
        self.profiles = profiles

    @lpq.hookimpl
    def lpq_register_backend_profiles(self, register: Any) -> None:
        for profile in self.profiles:
            register(profile)


@pytest.fixture
def fake(lpq_plugin: Any, tmp_path: Path) -> FakeAdaptorPlugin:
    plugin = FakeAdaptorPlugin(tmp_path)
    lpq_plugin(plugin, name="fake")
    lpq_plugin(
        ProfilePlugin(
            lpq.BackendProfile("npu", "fake", "a test NPU", scheme=NPU_SCHEME),
            lpq.BackendProfile("int8-sym-npu", "fake", scheme={"activation": {"dtype": "int8"}}),
        ),
        name="npu-profiles",
    )
    return plugin


@pytest.fixture
def capability(tmp_path: Path) -> lpq.FrameworkCapability:
    file = tmp_path / "cap.yaml"
    file.write_text(CAPABILITY_YAML)
    return lpq.load_capability(file, "fake", None).build(OPS, None)


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        (TensorScheme("int8"), (-128, 127)),
        (TensorScheme("int8", narrow_range=True), (-127, 127)),
        (TensorScheme("int8", reduce_range=True), (-64, 63)),
        (TensorScheme("int8", narrow_range=True, reduce_range=True), (-63, 63)),
        (TensorScheme("uint8", symmetric=False), (0, 255)),
        (TensorScheme("uint8", symmetric=False, reduce_range=True), (0, 127)),
        (TensorScheme("int4"), (-8, 7)),
        (TensorScheme("uint4", symmetric=False), (0, 15)),
    ],
)
def test_quant_ranges(scheme: TensorScheme, expected: tuple[int, int]) -> None:
    assert scheme.quant_range() == expected


def test_scheme_round_trips_through_json_and_resizes() -> None:
    scheme = QuantScheme.from_json(
        {
            "weight": {"dtype": "int8", "narrow_range": True, "scale": "pow2"},
            "activation": {"dtype": "uint8", "symmetric": False, "rounding": "half_up"},
            "placement": "inputs",
            "quantize_inputs_of": ["add"],
            "bias": "int32",
        }
    )
    assert scheme.weight.granularity == "per_channel"  # the default for weights
    assert QuantScheme.from_json(scheme.to_json()) == scheme
    four = scheme.with_bits(weight=4, activation=4)
    assert (four.weight.dtype, four.activation.dtype) == ("int4", "uint4")
    assert four.weight.scale == "pow2" and four.activation.rounding == "half_up"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"weight": {"dtype": "int8", "colour": 1}}, "unknown field"),
        ({"activation": {"rounding": "stochastic"}}, "rounding 'stochastic'"),
        ({"activation": {"dtype": "float8"}}, "not an integer type"),
        ({"placement": "everywhere"}, "placement"),
        ({"activation": {"granularity": "per_channel"}}, "per_tensor"),
        ({"bias": "int16"}, "bias"),
        ({"weights": {}}, "unknown field"),
    ],
)
def test_bad_schemes_say_what_is_wrong(data: dict[str, Any], message: str) -> None:
    with pytest.raises(lpq.ConfigError, match=message):
        QuantScheme.from_json(data)
    with pytest.raises(lpq.ConfigError, match=message):
        lpq.BackendProfile("bad", "fake", scheme=data)


def test_a_profile_parses_its_scheme_once() -> None:
    profile = lpq.BackendProfile("npu", "fake", scheme=NPU_SCHEME)
    assert isinstance(profile.quant_scheme, QuantScheme)
    assert profile.quant_scheme.activation.symmetric is False
    assert lpq.BackendProfile("plain", "fake").quant_scheme is None


def test_narrowing_keeps_what_the_backend_runs_and_says_why(
    capability: lpq.FrameworkCapability,
) -> None:
    narrowed, ruled_out = narrow_capability(capability, QuantScheme.from_json(NPU_SCHEME), "npu")
    conv = narrowed.op_configs(("conv1", "Conv"))
    assert conv, "Conv keeps its static per-tensor option"
    assert {c.weight.granularity for c in conv} == {"per_tensor"}
    assert {c.mode for c in conv} == {"static"}
    assert narrowed.op_configs(("fc", "MatMul")) == []
    texts = [r.text() for r in ruled_out]
    assert any("weight granularity per_tensor" in t and "per_channel" in t for t in texts)
    assert any("keeps MatMul in float" in t and "(2 op(s))" in t for t in texts)
    # The capability given is not modified.
    assert len(capability.op_configs(("conv1", "Conv"))) > len(conv)


def test_a_constraint_no_option_meets_leaves_the_op_in_fp32(
    capability: lpq.FrameworkCapability,
) -> None:
    scheme = QuantScheme.from_json({"activation": {"dtype": "int8"}})
    narrowed, ruled_out = narrow_capability(capability, scheme, "trt")
    assert all(narrowed.op_configs(key) == [] for key in OPS)
    texts = "\n".join(r.text() for r in ruled_out)
    assert "trt: activation dtype int8: ruled out activation dtype uint8" in texts
    assert "trt: activation scheme sym: ruled out activation scheme asym" in texts
    assert "no option of the capability fits" in texts


def test_reduce_range_must_be_offered_to_be_required(tmp_path: Path) -> None:
    yaml = CAPABILITY_YAML.replace(
        "weight: {dtype: [int8], scheme: [sym], granularity: [per_channel, per_tensor]}",
        "weight: {dtype: [int8], scheme: [sym], granularity: [per_channel, per_tensor], "
        "reduce_range: [false, true]}",
    )
    file = tmp_path / "cap.yaml"
    file.write_text(yaml)
    capability = lpq.load_capability(file, "fake", None).build(OPS, None)
    options = capability.opwise[("conv1", "Conv")][0].weight
    assert options is not None and options.extra["reduce_range"] == (False, True)
    scheme = QuantScheme(
        weight=TensorScheme("int8", granularity="per_channel", reduce_range=True),
        activation=TensorScheme("uint8", symmetric=False),
    )
    narrowed, _ = narrow_capability(capability, scheme, "avx2")
    weights = {c.weight.options["reduce_range"] for c in narrowed.op_configs(("conv1", "Conv"))}
    assert weights == {True}
    # The fake adaptor's own file offers no reduce_range: a 7-bit backend gets nothing.
    file.write_text(CAPABILITY_YAML)
    plain = lpq.load_capability(file, "fake", None).build(OPS, None)
    assert narrow_capability(plain, scheme, "avx2")[0].op_configs(("conv1", "Conv")) == []


def test_quantize_with_a_backend_hands_its_scheme_to_the_adaptor(fake: FakeAdaptorPlugin) -> None:
    model = FakeModel(ops=OPS)
    result = quantize(model, PostTrainingQuantConfig(backend="npu"), CALIB)
    cfg = result.tune_cfg
    assert cfg.options["backend"] == "npu"
    assert QuantScheme.from_json(cfg.options["backend_scheme"]) == QuantScheme.from_json(NPU_SCHEME)
    assert cfg.ops[("conv1", "Conv")].weight.granularity == "per_tensor"
    assert not cfg.ops[("fc", "MatMul")].quantized


def test_the_tuner_never_leaves_the_backend_and_reports_what_it_ruled_out(
    fake: FakeAdaptorPlugin, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ops = [(f"op{i}", "Conv" if i % 3 else "MatMul") for i in range(9)]
    model = FakeModel(ops=ops, sensitivity={"op4": 0.08, "op2": 0.05}, kl_helps=True)
    conf = PostTrainingQuantConfig(
        backend="npu",
        accuracy_criterion=AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=TuningCriterion(strategy="exhaustive", exit_policy="best", max_trials=40),
    )
    with caplog.at_level("INFO", logger="lpq"):
        result = fit(model, conf, CALIB, eval_dataloader=EVAL, workspace=tmp_path / "ws")
    assert len(result.trials) > 5
    for trial in result.trials:
        cfg = trial.config()
        assert cfg is not None
        for (name, op_type), op in cfg.ops.items():
            if op_type == "MatMul":
                assert not op.quantized, f"trial {trial.index} quantized {name}"
            elif op.quantized:
                assert op.mode == "static" and op.weight.granularity == "per_tensor"
    assert "npu: keeps MatMul in float: ruled out quantization for MatMul (3 op(s))" in caplog.text


def test_a_profile_for_another_framework_is_refused(lpq_plugin: Any, fake: Any) -> None:
    lpq_plugin(ProfilePlugin(lpq.BackendProfile("gpu", "torch", scheme={})), name="gpu-profile")
    with pytest.raises(lpq.ConfigError, match="backend profile 'gpu' is for torch"):
        quantize(FakeModel(ops=OPS), PostTrainingQuantConfig(backend="gpu"), CALIB)
