"""From capability YAML to what strategies consume: CapabilitySpec and FrameworkCapability."""

from __future__ import annotations

from pathlib import Path

import pytest

import lpq
from lpq import OpConfig, QuantCapability, TensorConfig, TensorOptions

BASE = """\
- version:
    name: default
  precisions: [int8, uint8, fp16, bf16, fp32]
  ops:
    int8: [Conv, MatMul, Add]
    fp16: [Conv, MatMul]
    bf16: ['*']
    fp32: ['*']
  capabilities:
    int8:
      static:
        Conv:
          weight:
            dtype: [int8]
            scheme: [sym]
            granularity: [per_channel, per_tensor]
          activation:
            dtype: [uint8, int8]
            scheme: [asym]
            algorithm: [minmax, kl]
        default:
          activation: {dtype: [uint8]}
      dynamic:
        MatMul:
          weight: {dtype: [int8]}
          activation: {dtype: [uint8], scheme: [asym]}
  patterns: ['Conv + Relu', 'MatMul + Add + Relu']
"""

INT4_EXTENSION = """\
- version:
    name: default
  precisions: [int4]
  ops:
    int4: [MatMul]
  capabilities:
    int4:
      weight_only:
        MatMul:
          weight:
            dtype: [int4]
            granularity: [per_block]
            algorithm: [rtn, gptq]
            block_size: [32, 128]
  patterns: ['Gemm + Relu']
"""


@pytest.fixture
def spec(tmp_path: Path) -> lpq.CapabilitySpec:
    file = tmp_path / "base.yaml"
    file.write_text(BASE)
    return lpq.load_capability(file, "toyfw", "1.0")


def test_for_op_type_own_entry_first_then_default(spec: lpq.CapabilitySpec):
    conv = spec.for_op_type("Conv")
    assert [(c.precision, c.mode) for c in conv] == [("int8", "static")]
    assert conv[0].weight == TensorOptions(
        dtype=("int8",), scheme=("sym",), granularity=("per_channel", "per_tensor")
    )
    assert conv[0].activation is not None
    assert conv[0].activation.algorithm == ("minmax", "kl")


def test_default_entry_covers_listed_op_types_without_their_own(spec: lpq.CapabilitySpec):
    add = spec.for_op_type("Add")
    assert [(c.precision, c.mode) for c in add] == [("int8", "static")]
    assert add[0].weight is None
    assert add[0].activation == TensorOptions(dtype=("uint8",))  # schema defaults filled in
    # MatMul has its own dynamic entry and gets the static default entry after it.
    matmul = spec.for_op_type("MatMul")
    assert [(c.precision, c.mode) for c in matmul] == [("int8", "dynamic"), ("int8", "static")]


def test_op_types_not_listed_are_not_quantizable(spec: lpq.CapabilitySpec):
    assert spec.for_op_type("Relu") == []
    assert spec.quantizable_op_types() == ["Add", "Conv", "MatMul"]


def test_float_fallbacks(spec: lpq.CapabilitySpec):
    assert spec.float_fallbacks("Conv") == ("fp32", "fp16", "bf16")
    assert spec.float_fallbacks("Add") == ("fp32", "bf16")  # bf16 lists '*'
    assert spec.float_fallbacks("Relu") == ("fp32", "bf16")


def test_patterns_are_tuples(spec: lpq.CapabilitySpec):
    assert spec.patterns == [("Conv", "Relu"), ("MatMul", "Add", "Relu")]


def test_build_opwise_and_optypewise(spec: lpq.CapabilitySpec):
    ops = [("conv1", "Conv"), ("relu1", "Relu"), ("mm", "MatMul"), ("conv2", "Conv")]
    cap = spec.build(ops, "1.0")
    assert cap.framework == "toyfw" and cap.framework_version == "1.0"
    assert cap.version_block == "default"
    assert list(cap.opwise) == [("conv1", "Conv"), ("mm", "MatMul"), ("conv2", "Conv")]
    assert set(cap.optypewise) == {"Conv", "MatMul"}
    assert cap.optypewise["Conv"] == spec.for_op_type("Conv")
    assert cap.fallback_precisions(("conv1", "Conv")) == ("fp32", "fp16", "bf16")
    assert cap.fallback_precisions(("unknown", "Relu")) == ("fp32",)
    assert cap.patterns == spec.patterns


def test_default_op_config_and_all_configs(spec: lpq.CapabilitySpec):
    cap = spec.build([("conv1", "Conv")], None)
    assert cap.default_op_config(("conv1", "Conv")) == OpConfig(
        "int8",
        "static",
        weight=TensorConfig("int8", "sym", "per_channel", "minmax"),
        activation=TensorConfig("uint8", "asym", "per_tensor", "minmax"),
    )
    configs = cap.op_configs(("conv1", "Conv"))
    # 2 weight granularities x 2 activation dtypes x 2 algorithms
    assert len(configs) == 8
    assert configs[0] == cap.default_op_config(("conv1", "Conv"))
    assert len(set(configs)) == 8
    assert all(cap.opwise[("conv1", "Conv")][0].allows(c) for c in configs)


def test_allows_rejects_what_the_capability_does_not_offer():
    qcap = QuantCapability(
        "int8", "static", weight=TensorOptions(("int8",)), activation=TensorOptions(("uint8",))
    )
    good = qcap.default_config()
    assert qcap.allows(good)
    assert not qcap.allows(OpConfig("int8", "dynamic", good.weight, good.activation))
    assert not qcap.allows(OpConfig("int8", "static", TensorConfig("uint8"), good.activation))
    assert not qcap.allows(OpConfig("int8", "static", good.weight, None))
    weight_only = QuantCapability("int4", "weight_only", weight=TensorOptions(("int4",)))
    assert not weight_only.allows(
        OpConfig("int4", "weight_only", TensorConfig("int4"), TensorConfig("uint8"))
    )


def test_second_file_adds_int4_for_an_op_type(tmp_path: Path):
    base, extra = tmp_path / "base.yaml", tmp_path / "int4.yaml"
    base.write_text(BASE)
    extra.write_text(INT4_EXTENSION)
    merged = lpq.load_capability([base, extra], "toyfw", "1.0")
    assert merged.precisions == ("int8", "uint8", "fp16", "bf16", "fp32", "int4")
    assert merged.ops["int4"] == ("MatMul",)
    assert merged.ops["int8"] == ("Conv", "MatMul", "Add")
    matmul = merged.for_op_type("MatMul")
    assert [(c.precision, c.mode) for c in matmul] == [
        ("int8", "dynamic"),
        ("int4", "weight_only"),
        ("int8", "static"),
    ]
    int4 = matmul[1]
    assert int4.weight is not None
    assert int4.weight.extra == {"block_size": (32, 128)}
    assert int4.default_config().weight == TensorConfig(
        "int4", "sym", "per_block", "rtn", {"block_size": 32}
    )
    assert len(int4.configs()) == 4  # 2 algorithms x 2 block sizes
    assert merged.for_op_type("Conv") == lpq.load_capability(base, "toyfw", "1.0").for_op_type(
        "Conv"
    )
    assert ("Gemm", "Relu") in merged.patterns
    assert "int4.yaml" in merged.version_block and str(extra) in merged.source


def test_no_files_is_an_error():
    with pytest.raises(lpq.CapabilityError, match="names no capability file"):
        lpq.load_capability([], "toyfw", "1.0")
