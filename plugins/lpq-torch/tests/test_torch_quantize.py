"""Real PT2E quantization of small real models: accuracy, per-op fallback, N-bit, QAT."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_testmodels import (
    DigitsConvNet,
    DigitsMLP,
    TinyTransformer,
    calib_loader,
    eval_loader,
    train,
)

import lpq
from lpq import TopK

Q_OPS = {
    "quantize_per_tensor",
    "quantize_per_channel",
    "dequantize_per_tensor",
    "dequantize_per_channel",
    "choose_qparams",
}


def default_cfg(cap: lpq.FrameworkCapability, **changes: lpq.OpConfig) -> lpq.TuneConfig:
    ops = {key: cap.default_op_config(key) for key in cap.opwise}
    for key in ops:
        if key[0] in changes:
            ops[key] = changes[key[0]]
    return lpq.TuneConfig(ops=ops, calib_sampling_size=200)


def accuracy(pm: lpq.PluginManager, model: torch.nn.Module) -> float:
    return pm.evaluate("torch", model, eval_loader(), [TopK(1)]).accuracy


def qnodes(gm: torch.fx.GraphModule, name: str) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and name in str(n.target)]


def op_node(gm: torch.fx.GraphModule, op_name: str) -> torch.fx.Node:
    for node in gm.graph.nodes:
        tag = (node.meta.get("custom") or {}).get("lpq_op", "")
        if tag.split("|")[0] == op_name:
            return node
    raise AssertionError(f"{op_name} not in graph")


def is_dequantized(node: object) -> bool:
    return isinstance(node, torch.fx.Node) and "dequantize" in str(node.target)


def test_trained_convnet_int8_keeps_accuracy(digits_convnet: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_convnet, calib_loader())
    assert [k for k in cap.opwise] == [
        ("features.0", "conv2d"),
        ("features.3", "conv2d"),
        ("classifier.1", "linear"),
        ("classifier.3", "linear"),
    ]
    qmodel = pm.quantize("torch", digits_convnet, default_cfg(cap), calib_loader())
    fp32, int8 = accuracy(pm, digits_convnet), accuracy(pm, qmodel)
    assert fp32 > 0.9, "the digits conv net should train to >90% top-1"
    assert int8 >= fp32 - 0.01
    # Every conv/linear really runs on int8-quantized weights and activations.
    for name, _ in cap.opwise:
        node = op_node(qmodel, name)
        assert is_dequantized(node.args[0]) and is_dequantized(node.args[1])


def test_original_model_is_not_modified(digits_convnet: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    before = {k: v.clone() for k, v in digits_convnet.state_dict().items()}
    cap = pm.query_capability("torch", digits_convnet, calib_loader())
    pm.quantize("torch", digits_convnet, default_cfg(cap), calib_loader())
    for key, value in digits_convnet.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not digits_convnet.training


@pytest.mark.parametrize("algorithm", ["mse", "percentile"])
def test_mlp_int8_with_histogram_observers(digits_mlp: torch.nn.Module, algorithm: str) -> None:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_mlp, calib_loader())
    ops = {}
    for key in cap.opwise:
        cfg = cap.default_op_config(key)
        act = lpq.TensorConfig("uint8", "asym", "per_tensor", algorithm)
        ops[key] = lpq.OpConfig(cfg.precision, cfg.mode, cfg.weight, act)
        assert cap.opwise[key][0].allows(ops[key])
    qmodel = pm.quantize("torch", digits_mlp, lpq.TuneConfig(ops, 200), calib_loader())
    assert accuracy(pm, qmodel) >= accuracy(pm, digits_mlp) - 0.01


def test_mlp_dynamic_int8(digits_mlp: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_mlp, calib_loader())
    ops = {}
    for key, caps in cap.opwise.items():
        dynamic = next(c for c in caps if c.mode == "dynamic")
        ops[key] = dynamic.default_config()
    qmodel = pm.quantize("torch", digits_mlp, lpq.TuneConfig(ops), calib_loader())
    # torchao's dynamic path: the Linear weights really are int8 tensors, read back as such.
    assert pm.quantized_ops("torch", qmodel) == {name: "int8" for name, _ in cap.opwise}
    assert "Int8" in type(qmodel.net[1].weight).__name__
    assert accuracy(pm, qmodel) >= accuracy(pm, digits_mlp) - 0.01


def test_transformer_block_int8_close_to_fp32() -> None:
    torch.manual_seed(0)
    model = train(TinyTransformer(), epochs=15)
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", model, calib_loader())
    types = {op_type for _, op_type in cap.opwise}
    assert types == {"linear", "matmul"}
    assert ("qkv", "linear") in cap.opwise
    matmuls = [name for name, t in cap.opwise if t == "matmul"]
    assert len(matmuls) == 2
    # By default the attention matmuls stay fp32, as in torchao's x86 recipe (capability
    # ``defaults``); the tuner may still pick int8 for them, as here.
    default = pm.quantize("torch", model, default_cfg(cap), calib_loader())
    assert not any(is_dequantized(op_node(default, m).args[0]) for m in matmuls)
    int8_matmuls = {m: cap.op_configs((m, "matmul"))[0] for m in matmuls}
    qmodel = pm.quantize("torch", model, default_cfg(cap, **int8_matmuls), calib_loader())
    fp32, int8 = accuracy(pm, model), accuracy(pm, qmodel)
    assert fp32 > 0.8
    assert int8 >= fp32 - 0.02
    assert all(is_dequantized(op_node(qmodel, m).args[0]) for m in matmuls)


def test_fp32_fallback_of_a_named_op_is_honoured(digits_convnet: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_convnet, calib_loader())
    cfg = default_cfg(cap, **{"features.3": lpq.OpConfig.fallback()})
    qmodel = pm.quantize("torch", digits_convnet, cfg, calib_loader())
    kept = op_node(qmodel, "features.3")
    assert not is_dequantized(kept.args[0]) and not is_dequantized(kept.args[1])
    assert kept.args[1].op == "get_attr"  # the fp32 weight itself
    quantized = op_node(qmodel, "features.0")
    assert is_dequantized(quantized.args[1])
    assert accuracy(pm, qmodel) >= accuracy(pm, digits_convnet) - 0.01


INT4_CONV = """\
    - version:
        name: default
      precisions: [int4]
      ops:
        int4: [conv2d]
      capabilities:
        int4:
          static:
            conv2d:
              weight: {dtype: [int4], scheme: [sym], granularity: [per_channel]}
              activation: {dtype: [uint4], scheme: [asym]}
"""


def test_int4_conv_added_purely_in_yaml(digits_convnet: torch.nn.Module, tmp_path: Path) -> None:
    extra = tmp_path / "int4-conv.yaml"
    extra.write_text(textwrap.dedent(INT4_CONV))
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability(
        "torch", digits_convnet, calib_loader(), {"capability_files": [str(extra)]}
    )
    conv_caps = cap.opwise[("features.0", "conv2d")]
    int4 = next(c for c in conv_caps if c.precision == "int4")
    # int4 static is added for conv2d only (linear has int4 weight-only of its own)
    linear_caps = cap.opwise[("classifier.1", "linear")]
    assert "int4" not in {c.precision for c in linear_caps if c.mode == "static"}
    changes = {name: int4.default_config() for name, t in cap.opwise if t == "conv2d"}
    qmodel = pm.quantize("torch", digits_convnet, default_cfg(cap, **changes), calib_loader())
    conv = op_node(qmodel, "features.3")
    weight_dq, act_dq = conv.args[1], conv.args[0]
    assert weight_dq.args[-3:] == (-8, 7, torch.int8)  # quant_min, quant_max, container
    assert act_dq.args[-3:] == (0, 15, torch.uint8)
    linear = op_node(qmodel, "classifier.1")
    assert linear.args[1].args[-3:] == (-128, 127, torch.int8)
    # The folded weight really holds int4 values.
    weights = getattr(qmodel, weight_dq.args[0].target)
    assert int(weights.min()) >= -8 and int(weights.max()) <= 7
    assert accuracy(pm, qmodel) > 0.5  # 4-bit convs still classify digits


def four_bit_cfg(cap: lpq.FrameworkCapability) -> lpq.TuneConfig:
    w = lpq.TensorConfig("int4", "sym", "per_tensor", "minmax")
    a = lpq.TensorConfig("uint4", "asym", "per_tensor", "minmax")
    ops = {key: lpq.OpConfig("int4", "static", w, a) for key in cap.opwise}
    return lpq.TuneConfig(ops=ops, calib_sampling_size=200)


def test_qat_improves_on_ptq_for_4_bit() -> None:
    # A narrow MLP: wide ones lose almost nothing at 4 bits on digits, leaving QAT no room.
    torch.manual_seed(0)
    digits_mlp = train(DigitsMLP(hidden=16), epochs=12)
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_mlp, calib_loader())
    cfg = four_bit_cfg(cap)
    ptq = pm.quantize("torch", digits_mlp, cfg, calib_loader())

    learned_scales: list[torch.Tensor] = []

    def train_func(prepared: torch.fx.GraphModule) -> None:
        from torch_testmodels import digits

        images, labels = digits("train")
        x, y = torch.from_numpy(images), torch.from_numpy(labels)
        params = [p for p in prepared.parameters() if p.requires_grad]
        scales = [
            m.scale for m in prepared.modules() if type(m).__name__ == "LearnableFakeQuantize"
        ]
        assert scales and all(s.requires_grad for s in scales), "scales must be learnable"
        start = [s.detach().clone() for s in scales]
        opt = torch.optim.Adam(params, lr=1e-3)
        for _ in range(4):
            perm = torch.randperm(len(y))
            for i in range(0, len(y), 64):
                idx = perm[i : i + 64]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(prepared(x[idx]), y[idx]).backward()
                opt.step()
        learned_scales.extend(s.detach() - s0 for s, s0 in zip(scales, start))

    torch.manual_seed(0)
    qat = pm.quantize("torch", digits_mlp, cfg, calib_loader(), train_func=train_func)
    assert any(float(d.abs().max()) > 0 for d in learned_scales), "scales received gradients"
    fp32, ptq_acc, qat_acc = accuracy(pm, digits_mlp), accuracy(pm, ptq), accuracy(pm, qat)
    assert qat_acc > ptq_acc + 0.02, (fp32, ptq_acc, qat_acc)
    assert qat_acc >= fp32 - 0.03
    node = op_node(qat, "net.1")
    assert node.args[1].args[-3:] == (-8, 7, torch.int8)  # same deployable N-bit graph


def test_bf16_conversion_casts_the_named_op(digits_mlp: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    pm.query_capability("torch", digits_mlp, calib_loader())
    model = pm.convert_bf16("torch", digits_mlp, ["net.3"], "bf16")
    node = op_node(model, "net.3")
    assert node.args[0].kwargs["dtype"] == torch.bfloat16
    x = torch.from_numpy(eval_loader().inputs[:16])
    with torch.no_grad():
        np.testing.assert_allclose(model(x).numpy(), digits_mlp(x).numpy(), atol=0.1)
    assert accuracy(pm, model) >= accuracy(pm, digits_mlp) - 0.01


def test_bf16_in_tune_cfg_with_int8_elsewhere(digits_mlp: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_mlp, calib_loader())
    assert "bf16" in cap.fallback_precisions(("net.1", "linear"))
    cfg = default_cfg(cap, **{"net.5": lpq.OpConfig.fallback("bf16")})
    qmodel = pm.quantize("torch", digits_mlp, cfg, calib_loader())
    assert op_node(qmodel, "net.5").args[0].kwargs["dtype"] == torch.bfloat16
    assert is_dequantized(op_node(qmodel, "net.1").args[1])
    assert accuracy(pm, qmodel) >= accuracy(pm, digits_mlp) - 0.01


def test_fused_patterns_of_the_convnet(digits_convnet: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    pm.query_capability("torch", digits_convnet, calib_loader())
    patterns = pm.query_fused_patterns("torch", digits_convnet)
    assert ("conv2d", "batch_norm", "relu") in patterns
    assert ("conv2d", "relu") in patterns
    assert ("linear", "relu") in patterns


def test_compiled_evaluation_measures_latency() -> None:
    torch.manual_seed(0)
    model = DigitsConvNet(width=4).eval()
    pm = lpq.get_plugin_manager()
    # 56 samples in batches of 16: the last batch is smaller and must not break the
    # compiled model.
    data = lpq.ArrayLoader(eval_loader().inputs[:56], eval_loader().labels[:56], 16)
    cap = pm.query_capability("torch", model, data)
    qmodel = pm.quantize("torch", model, default_cfg(cap), data)
    eager = pm.evaluate("torch", qmodel, data, [TopK(1)])
    measurer = lpq.LatencyMeasurer(warmup=1)
    timed = pm.evaluate("torch", qmodel, data, [TopK(1)], measurer=measurer)
    # Warm-up, then rounds over the first 4 batches: each batch's fastest run is a sample.
    assert timed.latency_ms is not None and len(measurer.samples) == 4
    assert timed.latency_ms == pytest.approx(1e3 * float(np.median(measurer.samples)))
    assert eager.latency_ms is None
    assert abs(timed.accuracy - eager.accuracy) <= 2 / 56  # int8 kernels vs reference q/dq
    fp32 = pm.evaluate("torch", model, data, [TopK(1)], measurer=lpq.LatencyMeasurer())
    assert fp32.latency_ms is not None and fp32.samples == 56
