"""Empty KV caches for decoder exports whose cache head size is symbolic (onnxruntime-genai's
builder names it ``kv_cache_dim``): lpq reads the size from the attention node and its
packed QKV projection, instead of a zero-width cache GroupQueryAttention rejects."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from lpq_onnxrt.data import input_specs
from lpq_onnxrt.llm_io import fill_decoder_inputs


def _decoder(heads: int = 4, kv_heads: int = 2, head: int = 16, hidden: int = 64):
    qkv = np.zeros((hidden, (heads + 2 * kv_heads) * head), np.float32)
    cache = ["batch_size", kv_heads, "past_sequence_length", "kv_cache_dim"]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed_lookup"),
        helper.make_node("MatMul", ["h", "qkv"], ["packed"], name="qkv_proj"),
        helper.make_node(
            "GroupQueryAttention",
            [
                "packed",
                "",
                "",
                "past_key_values.0.key",
                "past_key_values.0.value",
                "seqlens",
                "total",
            ],
            ["attn", "present.0.key", "present.0.value"],
            name="gqa",
            domain="com.microsoft",
            num_heads=heads,
            kv_num_heads=kv_heads,
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "seq"]),
            helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, cache),
            helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, cache),
        ],
        [helper.make_tensor_value_info("attn", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.zeros((32, hidden), np.float32), "embed"),
            numpy_helper.from_array(qkv, "qkv"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_symbolic_cache_head_size_is_read_from_the_attention_node():
    specs = {spec.name: spec for spec in input_specs(_decoder())}
    assert specs["past_key_values.0.key"].shape == (None, 2, None, 16)
    assert specs["past_key_values.0.value"].shape == (None, 2, None, 16)


def test_the_empty_cache_has_the_real_head_size():
    specs = input_specs(_decoder(heads=6, kv_heads=3, head=8, hidden=48))
    feed = fill_decoder_inputs(specs, {"input_ids": np.zeros((2, 5), np.int64)})
    assert feed["past_key_values.0.key"].shape == (2, 3, 0, 8)
