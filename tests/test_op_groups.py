"""Op groups from names (lpq.plan.op_groups) and wider / finer choices of the space."""

from __future__ import annotations

import pytest

from lpq import OpConfig, TensorConfig
from lpq.plan.op_groups import OpPlace, op_place, split_groups
from lpq.plan.tuning_space import TuningSpace


@pytest.mark.parametrize(
    ("name", "place"),
    [
        # onnxruntime-genai model builder
        ("/model/layers.3/attn/qkv_proj/MatMul", ("model/layers", 3, "attn/qkv_proj")),
        ("/model/layers.29/mlp/down_proj/MatMul", ("model/layers", 29, "mlp/down_proj")),
        # optimum (torch exporter) node names
        ("/model/layers.12/self_attn/q_proj/MatMul", ("model/layers", 12, "self_attn/q_proj")),
        ("/transformer/h.0/attn/c_attn/MatMul_1", ("transformer/h", 0, "attn/c_attn")),
        ("/model/decoder/layers.2/fc1/MatMul", ("model/decoder/layers", 2, "fc1")),
        # torch module names, and short names (l0.q_proj)
        ("model.layers.3.mlp.down_proj", ("model/layers", 3, "mlp/down_proj")),
        ("l1.down_proj", ("l", 1, "down_proj")),
    ],
)
def test_layer_and_kind_from_exporter_names(name, place):
    assert op_place(name) == OpPlace(*place)


@pytest.mark.parametrize("name", ["/lm_head/MatMul", "MatMul_12", "conv1", "/model/layers.3"])
def test_names_without_a_layer_have_no_place(name):
    assert op_place(name) is None


def _builder(layers: int) -> list[tuple[str, str]]:
    kinds = ("attn/qkv_proj", "attn/o_proj", "mlp/gate_proj", "mlp/up_proj", "mlp/down_proj")
    keys = [(f"/model/layers.{i}/{k}/MatMul", "MatMul") for i in range(layers) for k in kinds]
    return [*keys, ("/lm_head/MatMul", "MatMul")]


def test_split_goes_from_families_to_kinds_to_layer_blocks():
    keys = _builder(30)
    top = split_groups(keys)
    assert [(label, len(g)) for label, g in top] == [
        ("model/layers/*/attn", 60),
        ("model/layers/*/mlp", 90),
        ("/lm_head/MatMul", 1),
    ]
    mlp = top[1][1]
    assert [label for label, _ in split_groups(mlp)] == [
        "model/layers/*/mlp/gate_proj",
        "model/layers/*/mlp/up_proj",
        "model/layers/*/mlp/down_proj",
    ]
    down = [k for k in mlp if "down_proj" in k[0]]
    halves = split_groups(down, 2)
    assert [label for label, _ in halves] == [
        "model/layers.0-14/mlp/down_proj",
        "model/layers.15-29/mlp/down_proj",
    ]
    assert [k for _, g in halves for k in g] == down  # a partition, order kept


def test_optimum_names_split_by_family_then_kind():
    kinds = ("self_attn/q_proj", "self_attn/k_proj", "self_attn/v_proj", "self_attn/o_proj")
    keys = [(f"/model/layers.{i}/{k}/MatMul", "MatMul") for i in range(4) for k in kinds]
    keys += [(f"/model/layers.{i}/mlp/up_proj/MatMul", "MatMul") for i in range(4)]
    assert [label for label, _ in split_groups(keys)] == [
        "model/layers/*/self_attn",
        "model/layers/*/mlp",
    ]
    attn = split_groups(keys)[0][1]
    assert len(split_groups(attn)) == 4  # q, k, v, o


def test_too_many_kinds_fall_to_layer_blocks_and_unplaced_to_runs():
    keys = [(f"l{i}.{k}_proj", "MatMul") for i in range(2) for k in "qkvo"]
    keys += [(f"l{i}.{k}_proj", "MatMul") for i in range(2) for k in ("gate", "up", "down")]
    assert [label for label, _ in split_groups(keys)] == ["l.0", "l.1"]
    loose = [(f"MatMul_{i}", "MatMul") for i in range(10)]
    runs = split_groups(loose, 4)
    assert [len(g) for _, g in runs] == [3, 3, 3, 1]
    assert split_groups(loose[:3], 4) == [(k[0], [k]) for k in loose[:3]]  # per op
    assert split_groups(loose[:1]) == []


def _wo(dtype: str, scheme: str, algorithm: str, block: int) -> OpConfig:
    weight = TensorConfig(dtype, scheme, "per_block", algorithm, {"block_size": block})
    return OpConfig(dtype, "weight_only", weight, None)


def test_wider_keeps_algorithm_block_and_scheme_and_finer_is_a_separate_knob():
    key = ("mm", "MatMul")
    choices = [
        _wo(d, s, a, b)
        for d, s in (("int4", "sym"), ("uint4", "asym"), ("int8", "asym"), ("int8", "sym"))
        for a in ("rtn", "gptq")
        for b in (32, 128)
    ]
    space = TuningSpace({key: choices}, {key: ("fp32",)})
    assert space.wider(key, _wo("int4", "sym", "gptq", 128)) == _wo("int8", "sym", "gptq", 128)
    assert space.wider(key, _wo("uint4", "asym", "rtn", 32)) == _wo("int8", "asym", "rtn", 32)
    assert space.wider(key, _wo("int8", "sym", "rtn", 32)) is None  # widest already
    assert space.wider(key, OpConfig.fallback()) is None
    assert space.finer(key, _wo("int4", "sym", "gptq", 128)) == _wo("int4", "sym", "gptq", 32)
    assert space.finer(key, _wo("int4", "sym", "gptq", 32)) is None
    # the nearest block wins, whatever the order of the space's choices
    blocks = TuningSpace({key: [_wo("int4", "sym", "rtn", b) for b in (32, 128, 16, 64)]}, {})
    assert blocks.finer(key, _wo("int4", "sym", "rtn", 128)) == _wo("int4", "sym", "rtn", 64)
    assert blocks.finer(key, _wo("int4", "sym", "rtn", 32)) == _wo("int4", "sym", "rtn", 16)
    # a lone int8 choice that keeps nothing of int4 is still the wider one
    only = TuningSpace({key: [choices[0], _wo("int8", "asym", "gptq", 128)]}, {key: ("fp32",)})
    assert only.wider(key, choices[0]) == _wo("int8", "asym", "gptq", 128)


def test_static_int8_choices_have_no_wider_one():
    key = ("conv", "Conv")
    weight = TensorConfig("int8", "sym", "per_channel")
    static = [
        OpConfig("int8", "static", weight, TensorConfig(act, "asym")) for act in ("uint8", "int8")
    ]
    dynamic = OpConfig("int8", "dynamic", weight, TensorConfig("uint8", "asym"))
    space = TuningSpace({key: [*static, dynamic]}, {key: ("fp32",)})
    assert all(space.wider(key, c) is None for c in space.choices[key])
