"""Building the tuning space from capability and the user's config."""

from __future__ import annotations

from pathlib import Path

import pytest

import lpq
from lpq.config import PostTrainingQuantConfig
from lpq.plan.tuning_space import build_tuning_space
from lpq.testing.fake_adaptor import CAPABILITY_YAML

OPS = [("conv1", "Conv"), ("conv2", "Conv"), ("fc", "MatMul"), ("head", "MatMul")]


@pytest.fixture
def capability(tmp_path: Path) -> lpq.FrameworkCapability:
    file = tmp_path / "cap.yaml"
    file.write_text(CAPABILITY_YAML)
    return lpq.load_capability(file, "fake", None).build(OPS, None)


def space_for(capability, has_calib_data=True, **conf):
    return build_tuning_space(
        capability, PostTrainingQuantConfig(**conf), has_calib_data=has_calib_data
    )


def test_default_prefers_static_and_first_options(capability):
    space = space_for(capability)
    cfg = space.default()
    assert {c.mode for c in cfg.ops.values()} == {"static"}
    conv = cfg.ops[("conv1", "Conv")]
    assert conv.weight.granularity == "per_channel" and conv.activation.dtype == "uint8"


def test_dynamic_without_calibration_data_quantizes_what_has_dynamic(capability):
    cfg = space_for(capability, has_calib_data=False, approach="dynamic").default()
    assert cfg.ops[("fc", "MatMul")].mode == "dynamic"
    assert not cfg.ops[("conv1", "Conv")].quantized  # Conv has no dynamic capability here


def test_auto_without_calibration_data_is_an_error_not_dynamic_only(capability):
    with pytest.raises(lpq.ConfigError, match="'auto' approach tries static quantization"):
        space_for(capability, has_calib_data=False)


def test_string_override_forces_fallback_everywhere(capability):
    space = space_for(capability, op_type_dict={"MatMul": "fp32"})
    assert space.tunable_ops == [("conv1", "Conv"), ("conv2", "Conv")]
    assert space.all_fallback().ops[("fc", "MatMul")].precision == "fp32"
    assert space.make({}).ops[("head", "MatMul")].precision == "fp32"


def test_name_regex_matches_in_full(capability):
    with pytest.raises(lpq.ConfigError, match=r"op_name_dict\['conv'\] matches no"):
        space_for(capability, op_name_dict={"conv": "fp32"})
    space = space_for(capability, op_name_dict={"conv[0-9]": "bf16"})
    assert {space.forced[k].precision for k in space.forced} == {"bf16"}


def test_dict_override_restricts_options(capability):
    space = space_for(
        capability, op_type_dict={"Conv": {"weight": {"granularity": ["per_tensor"]}}}
    )
    for cfg in space.choices[("conv1", "Conv")]:
        assert cfg.weight.granularity == "per_tensor"
    assert space.choices[("fc", "MatMul")][0].weight.granularity == "per_channel"


def test_override_that_allows_nothing_is_a_clear_error(capability):
    with pytest.raises(lpq.ConfigError, match="allows none of the options"):
        space_for(capability, op_type_dict={"Conv": {"weight": {"dtype": ["int4"]}}})


def test_op_defaults_are_lenient(capability):
    space = space_for(
        capability, approach="auto", op_defaults={"activation": {"algorithm": ["kl"]}}
    )
    assert space.default().ops[("conv1", "Conv")].activation.algorithm == "kl"
    # Dynamic MatMul options have no kl: with no calibration data they keep their own.
    dyn = space_for(
        capability,
        has_calib_data=False,
        approach="dynamic",
        op_defaults={"activation": {"algorithm": ["kl"]}},
    )
    assert dyn.default().ops[("fc", "MatMul")].activation.algorithm == "minmax"


def test_excluded_precisions_drop_fallbacks_and_dtypes(capability):
    space = space_for(capability)
    assert space.fallbacks[("conv1", "Conv")] == ("fp32", "bf16")
    space = space_for(capability, excluded_precisions=["bf16"])
    assert space.fallbacks[("conv1", "Conv")] == ("fp32",)
    space = space_for(capability, excluded_precisions=["uint8"])
    assert all(not cfg.quantized for cfg in space.default().ops.values())


def test_op_type_variants_are_shared_by_all_ops_of_the_type(capability):
    variants = space_for(capability).op_type_variants("Conv")
    assert variants[0] == space_for(capability).default().ops[("conv1", "Conv")]
    assert len(variants) == len(set(variants)) == 4  # 2 granularities x 2 algorithms


@pytest.mark.parametrize(
    "kwargs",
    [
        {"approach": "fast"},
        {"quant_format": "qd"},
        {"calibration_sampling_size": 0},
        {"op_type_dict": {"Conv": "int8"}},
        {"op_type_dict": {"Conv": {"weights": {}}}},
        {"op_type_dict": {"Conv": {"weight": {"colour": ["red"]}}}},
        {"op_name_dict": {"conv(": "fp32"}},
    ],
)
def test_invalid_config_values_are_config_errors(kwargs):
    with pytest.raises(lpq.ConfigError):
        PostTrainingQuantConfig(**kwargs)


WEIGHT_ONLY_YAML = CAPABILITY_YAML.replace(
    "  precisions: [int8, uint8, fp32, bf16]",
    "  recipes:\n    bias_correction: [false, true]\n  precisions: [int8, int4, uint8, fp32, bf16]",
).replace(
    "    int8: [Conv, MatMul]\n",
    "    int8: [Conv, MatMul]\n    int4: [MatMul]\n",
) + """    int4:
      weight_only:
        MatMul:
          weight: {dtype: [int4], scheme: [sym], granularity: [per_channel]}
"""


def test_recipes_are_searched_only_where_integer_kernel_ops_are(tmp_path):
    """Recipes (bias correction, latency-aware int8, ...) act on static / dynamic ops: a
    weight-only space offers none, so no trial is spent on one that changes nothing."""
    file = tmp_path / "cap.yaml"
    file.write_text(WEIGHT_ONLY_YAML)
    capability = lpq.load_capability(file, "fake", None).build(OPS, None)
    assert space_for(capability).recipes == {"bias_correction": (False, True)}
    weight_only = space_for(capability, has_calib_data=False, approach="weight_only")
    assert {c.mode for c in weight_only.default().ops.values() if c.quantized} == {"weight_only"}
    assert weight_only.recipes == {}
    assert "bias_correction" not in weight_only.default().options
