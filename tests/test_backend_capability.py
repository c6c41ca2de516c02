"""Capability YAML fields for targets: ``valid_mixed_precision`` and ``reduce_range``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from core_testutil import REPO

import lpq
from lpq.api import fit
from lpq.config import AccuracyCriterion, PostTrainingQuantConfig, TuningCriterion
from lpq.plan.tuning_space import build_tuning_space
from lpq.testing.fake_adaptor import CAPABILITY_YAML, FakeAdaptorPlugin, FakeModel

OPS = [("conv1", "Conv"), ("conv2", "Conv"), ("fc", "MatMul")]
NO_BF16 = '  valid_mixed_precision: ["int8 + fp32", "bf16 + fp32"]\n'


def load(tmp_path: Path, text: str) -> lpq.FrameworkCapability:
    file = tmp_path / "cap.yaml"
    file.write_text(text)
    return lpq.load_capability(file, "fake", None).build(OPS, None)


def with_field(line: str) -> str:
    return CAPABILITY_YAML.replace("  ops:\n", line + "  ops:\n", 1)


def test_combinations_are_read_and_merged(tmp_path: Path) -> None:
    cap = load(tmp_path, with_field(NO_BF16))
    assert cap.valid_mixed_precision == [("int8", "fp32"), ("bf16", "fp32")]
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "- version: {name: default}\n  precisions: [int8, bf16, fp32]\n"
        '  ops: {fp32: ["*"]}\n  valid_mixed_precision: ["int8 + bf16 + fp32", "int8 + fp32"]\n'
    )
    (tmp_path / "main.yaml").write_text(with_field(NO_BF16))
    spec = lpq.load_capability([tmp_path / "main.yaml", extra], "fake", None)
    assert spec.valid_mixed_precision == [
        ("int8", "fp32"),
        ("bf16", "fp32"),
        ("int8", "bf16", "fp32"),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('  valid_mixed_precision: ["int8 + fp16"]\n', "precision 'fp16' of combination"),
        ('  valid_mixed_precision: ["int8+fp32"]\n', "is not a precision combination"),
        ("  valid_mixed_precision: []\n", "should be non-empty"),
    ],
)
def test_bad_combinations_fail_at_their_line(tmp_path: Path, line: str, message: str) -> None:
    file = tmp_path / "cap.yaml"
    file.write_text(with_field(line))
    with pytest.raises(lpq.CapabilityError, match=message) as info:
        lpq.validate_capability_file(file)
    assert "cap.yaml:4:" in str(info.value)


def test_the_space_keeps_one_combination(tmp_path: Path) -> None:
    cap = load(tmp_path, with_field(NO_BF16))
    space = build_tuning_space(cap, PostTrainingQuantConfig(), has_calib_data=True)
    assert all(fb == ("fp32",) for fb in space.fallbacks.values())
    assert [r.text() for r in space.ruled_out] == [
        "valid_mixed_precision 'int8 + fp32': ruled out bf16 for Conv, MatMul (3 op(s))"
    ]
    # Without the field, bf16 stays a fallback.
    plain = build_tuning_space(
        load(tmp_path, CAPABILITY_YAML), PostTrainingQuantConfig(), has_calib_data=True
    )
    assert plain.fallbacks[("conv1", "Conv")] == ("fp32", "bf16") and not plain.ruled_out


def test_excluding_int8_picks_the_float_combination(tmp_path: Path) -> None:
    cap = load(tmp_path, with_field(NO_BF16))
    space = build_tuning_space(
        cap, PostTrainingQuantConfig(excluded_precisions=["int8"]), has_calib_data=True
    )
    assert not space.tunable_ops
    assert {cfg.precision for cfg in space.forced.values()} == {"fp32"}


def test_a_forced_precision_outside_the_combination_is_an_error(tmp_path: Path) -> None:
    cap = load(tmp_path, with_field(NO_BF16))
    with pytest.raises(lpq.ConfigError, match="set to bf16, which the target's"):
        build_tuning_space(
            cap, PostTrainingQuantConfig(op_name_dict={"fc": "bf16"}), has_calib_data=True
        )


def test_a_combination_without_a_float_fallback_is_an_error(tmp_path: Path) -> None:
    cap = load(tmp_path, with_field('  valid_mixed_precision: ["int8"]\n'))
    with pytest.raises(lpq.ConfigError, match="no float precision to fall back to"):
        build_tuning_space(cap, PostTrainingQuantConfig(), has_calib_data=True)


def test_the_tuner_never_leaves_the_combination(lpq_plugin, tmp_path: Path) -> None:
    plugin = FakeAdaptorPlugin(tmp_path)
    plugin.capability_file.write_text(with_field(NO_BF16))
    lpq_plugin(plugin, name="fake")
    model = FakeModel(ops=OPS, sensitivity={"conv1": 0.08, "fc": 0.05})
    conf = PostTrainingQuantConfig(
        accuracy_criterion=AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=TuningCriterion(strategy="exhaustive", exit_policy="best", max_trials=30),
    )
    result = fit(
        model,
        conf,
        [np.zeros((4, 1), np.float32)],
        eval_dataloader=[(np.zeros((100, 1), np.float32), np.arange(100) % 10)],
        workspace=tmp_path / "ws",
    )
    configs = [cfg for trial in result.trials if (cfg := trial.config()) is not None]
    used = {op.precision for cfg in configs for op in cfg.ops.values()}
    assert len(result.trials) > 5 and used == {"int8", "fp32"}


def test_reduce_range_is_a_tensor_option(tmp_path: Path) -> None:
    text = CAPABILITY_YAML.replace(
        "granularity: [per_channel, per_tensor]}",
        "granularity: [per_channel, per_tensor], reduce_range: [false, true]}",
    )
    cap = load(tmp_path, text)
    configs = cap.op_configs(("conv1", "Conv"))
    assert configs[0].weight.options == {"reduce_range": False}
    assert {c.weight.options["reduce_range"] for c in configs} == {False, True}
    space = build_tuning_space(
        cap,
        PostTrainingQuantConfig(op_type_dict={"Conv": {"weight": {"granularity": ["per_tensor"]}}}),
        has_calib_data=True,
    )
    assert len(space.choices[("conv1", "Conv")]) == 4  # 2 reduce_range x 2 algorithms
    file = tmp_path / "bad.yaml"
    file.write_text(text.replace("reduce_range: [false, true]", "reduce_range: [7]"))
    with pytest.raises(lpq.CapabilityError, match="reduce_range"):
        lpq.validate_capability_file(file)


def test_onnxrt_offers_reduce_range_for_weights() -> None:
    """ONNX Runtime's capability lists reduce_range (7-bit weights) for x86 without VNNI."""
    path = REPO / "plugins" / "lpq-onnxrt" / "lpq_onnxrt" / "capabilities" / "onnxrt.yaml"
    blocks = yaml.safe_load(path.read_text())
    conv = blocks[0]["capabilities"]["int8"]["static"]["Conv"]["weight"]
    assert conv["reduce_range"] == [False, True]
    spec = lpq.load_capability(path, "onnxrt", "1.31")
    options = spec.for_op_type("Conv")[0].weight
    assert options is not None and options.extra["reduce_range"] == (False, True)


def test_the_avx2_profile_narrows_onnxrt_weights_to_7_bits() -> None:
    """``onnxrt-cpu-avx2`` ∩ ONNX Runtime's capability: 7-bit static weights, U8 inputs."""
    from lpq.plan.backend import narrow_capability

    profile = lpq.get_plugin_manager().backend_profile("onnxrt-cpu-avx2")
    assert profile.framework == "onnxrt" and profile.quant_scheme is not None
    path = REPO / "plugins" / "lpq-onnxrt" / "lpq_onnxrt" / "capabilities" / "onnxrt.yaml"
    cap = lpq.load_capability(path, "onnxrt", "1.31").build([("c", "Conv"), ("m", "Mul")], "1.31")
    narrowed, ruled_out = narrow_capability(cap, profile.quant_scheme, profile.name)
    conv = narrowed.op_configs(("c", "Conv"))
    assert conv and {c.weight.options["reduce_range"] for c in conv} == {True}
    assert {(c.mode, c.activation.dtype, c.activation.scheme) for c in conv} == {
        ("static", "uint8", "asym")
    }
    assert any(r.removed == "weight reduce_range false" for r in ruled_out)
    assert any("dynamic" in r.removed for r in ruled_out)


def test_what_was_ruled_out_is_in_the_summary_and_history(lpq_plugin, tmp_path: Path) -> None:
    import json

    plugin = FakeAdaptorPlugin(tmp_path)
    plugin.capability_file.write_text(with_field(NO_BF16))
    lpq_plugin(plugin, name="fake")
    conf = PostTrainingQuantConfig(tuning_criterion=TuningCriterion(max_trials=2))
    result = fit(
        FakeModel(ops=OPS),
        conf,
        [np.zeros((4, 1), np.float32)],
        eval_dataloader=[(np.zeros((100, 1), np.float32), np.arange(100) % 10)],
        workspace=tmp_path / "ws",
    )
    ruled_out = result.summary()["backend_ruled_out"]
    assert ruled_out and "bf16" in ruled_out[0]["text"]
    assert json.loads(result.history_path.read_text())["backend_ruled_out"] == ruled_out
