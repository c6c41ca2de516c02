"""Capability ``defaults``: per op type, what the default configuration does with it.

An adaptor can keep an op type float by default while still offering int8 for it (the
tuner may quantize it), as torchao's x86 recipe does for attention matmuls, or make a
mode such as ``dynamic`` the default quantized choice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lpq
from lpq.plan.tuning_space import build_tuning_space
from lpq.testing.fake_adaptor import CAPABILITY_YAML, FakeAdaptorPlugin, FakeModel

OPS = [("conv", "Conv"), ("mm0", "MatMul"), ("mm1", "MatMul")]


def capability(folder: Path, defaults: str) -> lpq.FrameworkCapability:
    path = folder / "with-defaults.yaml"
    path.write_text(CAPABILITY_YAML + "  defaults:\n" + defaults)
    return lpq.load_capability(path, "fake", None).build(OPS, None)


def space(folder: Path, defaults: str, conf: lpq.PostTrainingQuantConfig | None = None):
    return build_tuning_space(
        capability(folder, defaults), conf or lpq.PostTrainingQuantConfig(), has_calib_data=True
    )


def test_a_float_default_keeps_the_op_type_float_but_quantizable(tmp_path):
    cap = capability(tmp_path, "    MatMul: fp32\n")
    assert not cap.default_op_config(("mm0", "MatMul")).quantized
    assert cap.default_op_config(("conv", "Conv")).quantized
    assert all(c.quantized for c in cap.op_configs(("mm0", "MatMul"))), "int8 still offered"

    tuning = space(tmp_path, "    MatMul: fp32\n")
    default = tuning.default()
    assert [default.ops[k].quantized for k in tuning.ops] == [True, False, False]
    assert tuning.float_defaults == {("mm0", "MatMul"): "fp32", ("mm1", "MatMul"): "fp32"}
    assert tuning.choices[("mm0", "MatMul")][0].quantized


def test_a_mode_default_moves_that_mode_first(tmp_path):
    cap = capability(tmp_path, "    MatMul: dynamic\n")
    assert cap.default_op_config(("mm0", "MatMul")).mode == "dynamic"
    assert cap.default_op_config(("conv", "Conv")).mode == "static"
    tuning = space(tmp_path, "    MatMul: dynamic\n")
    assert tuning.default().ops[("mm0", "MatMul")].mode == "dynamic"
    assert {c.mode for c in tuning.choices[("mm0", "MatMul")]} == {"static", "dynamic"}


def test_a_users_override_beats_the_capability_default(tmp_path):
    conf = lpq.PostTrainingQuantConfig(op_type_dict={"MatMul": {"activation": {"dtype": "uint8"}}})
    tuning = space(tmp_path, "    MatMul: fp32\n", conf)
    assert tuning.float_defaults == {}
    assert tuning.default().ops[("mm0", "MatMul")].quantized


def test_a_float_default_must_be_a_listed_precision(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(CAPABILITY_YAML + "  defaults:\n    MatMul: fp16\n")
    with pytest.raises(lpq.CapabilityError, match=r"fp16.*not listed in 'precisions'") as info:
        lpq.load_capability(path, "fake", None)
    assert "bad.yaml:" in str(info.value), "the error names the file and line"
    path.write_text(CAPABILITY_YAML + "  defaults:\n    MatMul: int4\n")
    with pytest.raises(lpq.CapabilityError):
        lpq.load_capability(path, "fake", None)


class FloatMatMulByDefault(FakeAdaptorPlugin):
    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.capability_file.write_text(CAPABILITY_YAML + "  defaults:\n    MatMul: fp32\n")


def test_auto_tries_quantizing_a_float_default_op_type(lpq_plugin, tmp_path):
    """The default leaves MatMul float; with budget left the tuner tries int8 MatMuls,
    and keeps them when they still meet the goal (the objective is speed)."""
    lpq_plugin(FloatMatMulByDefault(tmp_path), name="fake")
    model = FakeModel(ops=OPS, sensitivity={"conv": 0.001, "mm0": 0.001, "mm1": 0.001})
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.05),
        tuning_criterion=lpq.TuningCriterion(max_trials=10, exit_policy="best"),
    )
    result = lpq.fit(
        model,
        conf,
        [np.zeros((4, 1), np.float32)],
        eval_dataloader=[(np.zeros((1000, 1), np.float32), np.arange(1000) % 10)],
        workspace=tmp_path / "ws",
    )
    first = result.trials[0].config()
    assert first is not None and not first.ops[("mm0", "MatMul")].quantized
    stages = [t.stage for t in result.trials]
    assert "quantize op type MatMul" in stages, stages
    assert result.best.quantized_ops == 3, "int8 MatMuls met the goal and are faster"
