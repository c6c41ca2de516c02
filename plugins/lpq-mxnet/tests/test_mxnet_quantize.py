"""lpq_quantize on a trained digits CNN: calibration algorithms, granularity, fallback,
activation dtypes. Accuracy is measured by running the quantized block; what runs int8
is read from the quantized graph."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import lpq
from lpq_mxnet.graph import graph_json, group_of, groups
from lpq_mxnet.model_io import info_of


def tune_cfg(cap: Any, samples: int = 200, **activation: Any) -> lpq.TuneConfig:
    """The capability's default config, with activation options replaced for every op."""
    ops = {}
    for key in cap.opwise:
        cfg = cap.default_op_config(key)
        if activation and cfg.activation is not None:
            cfg = replace(cfg, activation=replace(cfg.activation, **activation))
        ops[key] = cfg
    return lpq.TuneConfig(ops=ops, calib_sampling_size=samples)


def with_weight_granularity(cfg: lpq.TuneConfig, op_type: str, value: str) -> lpq.TuneConfig:
    return cfg.with_ops(
        {
            key: replace(op, weight=replace(op.weight, granularity=value))
            for key, op in cfg.ops.items()
            if key[1] == op_type and op.weight is not None
        }
    )


def nodes(block: Any) -> list[dict[str, Any]]:
    info = info_of(block)
    assert info is not None
    nodes: list[dict[str, Any]] = graph_json(info.symbol)["nodes"]
    return nodes


def node_running(block: Any, op_name: str) -> Any:
    info = info_of(block)
    assert info is not None
    group = group_of(groups(graph_json(info.symbol)), op_name)
    assert group is not None, f"{op_name} is not in the quantized graph"
    return group


@pytest.fixture
def cap(pm: Any, digits_cnn: Any, calib_loader: Any) -> Any:
    return pm.query_capability("mxnet", digits_cnn, calib_loader, {})


@pytest.fixture
def fp32_top1(pm: Any, digits_cnn: Any, eval_loader: Any, top1: Any) -> float:
    accuracy: float = pm.evaluate("mxnet", digits_cnn, eval_loader, [top1]).accuracy
    assert accuracy > 0.95, "the digits CNN did not train"
    return accuracy


def test_capability_lists_one_op_per_fusion_group(cap: Any) -> None:
    assert list(cap.opwise) == [
        ("digits_conv0_fwd", "Convolution"),  # + BatchNorm + ReLU, fused
        ("digits_conv1_fwd", "Convolution"),  # + ReLU
        ("digits_pool0_fwd", "Pooling"),
        ("digits_flatten0_flatten0", "Flatten"),
        ("digits_dense0_fwd", "FullyConnected"),  # + ReLU
        ("digits_dense1_fwd", "FullyConnected"),
    ]
    assert cap.version_block == "1.9"


def test_fused_patterns_are_read_from_the_oneDNN_partition(pm: Any, digits_cnn: Any) -> None:
    assert pm.query_fused_patterns("mxnet", digits_cnn) == [
        ("Convolution", "BatchNorm", "Activation"),
        ("Convolution", "Activation"),
        ("FullyConnected", "Activation"),
    ]


@pytest.mark.parametrize("algorithm", ["minmax", "kl", "percentile"])
def test_calibration_keeps_accuracy_within_one_percent(
    pm: Any,
    cap: Any,
    digits_cnn: Any,
    calib_loader: Any,
    eval_loader: Any,
    top1: Any,
    fp32_top1: float,
    algorithm: str,
) -> None:
    qnet = pm.quantize("mxnet", digits_cnn, tune_cfg(cap, algorithm=algorithm), calib_loader)
    assert set(pm.quantized_ops("mxnet", qnet).values()) == {"int8"}
    assert pm.evaluate("mxnet", qnet, eval_loader, [top1]).accuracy >= fp32_top1 * 0.99
    # The fast path: quantize_net_v2's block, re-hybridized with static memory and shapes.
    flags = dict(qnet._flags)
    assert flags["static_alloc"] is True and flags["static_shape"] is True
    assert qnet._active


def test_clipping_algorithms_never_widen_a_range(
    pm: Any, cap: Any, digits_cnn: Any, calib_loader: Any
) -> None:
    ranges = {}
    for algorithm in ("minmax", "kl", "percentile"):
        qnet = pm.quantize("mxnet", digits_cnn, tune_cfg(cap, algorithm=algorithm), calib_loader)
        ranges[algorithm] = {
            n["name"]: float(n["attrs"]["max_calib_range"])
            for n in nodes(qnet)
            if "max_calib_range" in n.get("attrs", {}) and n["name"] != "data_quantize"
        }
    assert ranges["minmax"] and set(ranges["kl"]) == set(ranges["minmax"])
    for name, widest in ranges["minmax"].items():
        assert ranges["kl"][name] <= widest + 1e-6 and ranges["percentile"][name] <= widest + 1e-6
    assert any(ranges["kl"][n] < 0.99 * ranges["minmax"][n] for n in ranges["minmax"])


@pytest.mark.parametrize("granularity", ["per_channel", "per_tensor"])
def test_fully_connected_weight_granularity(
    pm: Any,
    cap: Any,
    digits_cnn: Any,
    calib_loader: Any,
    eval_loader: Any,
    top1: Any,
    fp32_top1: float,
    granularity: str,
) -> None:
    cfg = with_weight_granularity(tune_cfg(cap), "FullyConnected", granularity)
    qnet = pm.quantize("mxnet", digits_cnn, cfg, calib_loader)
    fc = node_running(qnet, "digits_dense0_fwd")
    assert fc.quantized
    per_channel = fc.attrs.get("channel_wise_quantize", "").lower() == "true"
    assert per_channel == (granularity == "per_channel")
    # Per-tensor FullyConnected weights are stored int8 in the model; per-channel ones
    # stay fp32 and are quantized by the oneDNN kernel.
    stored = {n["name"] for n in nodes(qnet) if n["op"] == "null"}
    assert ("digits_dense0_weight_quantize" in stored) == (granularity == "per_tensor")
    assert pm.evaluate("mxnet", qnet, eval_loader, [top1]).accuracy >= fp32_top1 * 0.99


def test_mixed_fully_connected_granularity_uses_per_channel(
    pm: Any, cap: Any, digits_cnn: Any, calib_loader: Any, caplog: Any
) -> None:
    cfg = with_weight_granularity(tune_cfg(cap), "FullyConnected", "per_tensor")
    dense0 = ("digits_dense0_fwd", "FullyConnected")
    weight = replace(cfg.ops[dense0].weight, granularity="per_channel")
    cfg = cfg.with_ops({dense0: replace(cfg.ops[dense0], weight=weight)})
    with caplog.at_level(logging.WARNING, logger="lpq_mxnet.passes.static"):
        qnet = pm.quantize("mxnet", digits_cnn, cfg, calib_loader)
    assert "one weight granularity to every FullyConnected" in caplog.text
    for name in ("digits_dense0_fwd", "digits_dense1_fwd"):
        assert node_running(qnet, name).attrs.get("channel_wise_quantize") == "True"


def test_fallback_of_named_layers_stays_fp32_in_the_graph(
    pm: Any,
    cap: Any,
    digits_cnn: Any,
    calib_loader: Any,
    eval_loader: Any,
    top1: Any,
    fp32_top1: float,
) -> None:
    fallback = {("digits_conv1_fwd", "Convolution"), ("digits_dense1_fwd", "FullyConnected")}
    cfg = tune_cfg(cap).with_ops({key: lpq.OpConfig.fallback() for key in fallback})
    qnet = pm.quantize("mxnet", digits_cnn, cfg, calib_loader)
    found = pm.quantized_ops("mxnet", qnet)
    assert {name for name, p in found.items() if p == "fp32"} == {n for n, _ in fallback}
    assert {name for name, p in found.items() if p == "int8"} == {
        "digits_conv0_fwd", "digits_pool0_fwd", "digits_flatten0_flatten0", "digits_dense0_fwd"
    }  # fmt: skip
    conv1 = node_running(qnet, "digits_conv1_fwd")
    assert not conv1.quantized and conv1.op == "_sg_mkldnn_conv"  # fused, in fp32
    assert not node_running(qnet, "digits_dense1_fwd").quantized
    assert pm.evaluate("mxnet", qnet, eval_loader, [top1]).accuracy >= fp32_top1 * 0.99


def test_op_name_dict_falls_back_by_regular_expression(
    digits_cnn: Any, calib_loader: Any, pm: Any
) -> None:
    # latency_aware off: what runs int8 here must not depend on this machine's timings
    conf = lpq.PostTrainingQuantConfig(op_name_dict={"digits_dense.*": "fp32"}, latency_aware=False)
    result = lpq.quantize(digits_cnn, conf, calib_loader)
    found = pm.quantized_ops("mxnet", result.model)
    assert found["digits_dense0_fwd"] == found["digits_dense1_fwd"] == "fp32"
    assert found["digits_conv0_fwd"] == found["digits_conv1_fwd"] == "int8"


def test_activation_dtype_int8_forces_a_signed_range(
    pm: Any, cap: Any, digits_cnn: Any, calib_loader: Any
) -> None:
    conv0 = ("digits_conv0_fwd", "Convolution")
    default = pm.quantize("mxnet", digits_cnn, tune_cfg(cap), calib_loader)
    cfg = tune_cfg(cap).with_ops(
        {conv0: replace(cap.default_op_config(conv0), activation=replace(
            cap.default_op_config(conv0).activation, dtype="int8"))}
    )  # fmt: skip
    signed = pm.quantize("mxnet", digits_cnn, cfg, calib_loader)
    # conv0 ends in a ReLU: uint8 (range from 0) by default, int8 (symmetric) when asked.
    assert float(node_running(default, "digits_conv0_fwd").attrs["min_calib_range"]) == 0.0
    assert float(node_running(signed, "digits_conv0_fwd").attrs["min_calib_range"]) < 0.0


def test_the_input_model_is_not_modified(
    pm: Any, cap: Any, digits_cnn: Any, calib_loader: Any, digits: dict[str, np.ndarray]
) -> None:
    import mxnet as mx

    x = mx.nd.array(digits["test_x"][:8])
    before = {k: v.data().asnumpy().copy() for k, v in digits_cnn.collect_params().items()}
    out_before = digits_cnn(x).asnumpy()
    pm.quantize("mxnet", digits_cnn, tune_cfg(cap, algorithm="kl"), calib_loader)
    assert not digits_cnn._active, "quantize hybridized the user's block"
    for key, value in digits_cnn.collect_params().items():
        np.testing.assert_array_equal(value.data().asnumpy(), before[key])
    np.testing.assert_array_equal(digits_cnn(x).asnumpy(), out_before)


def test_quantized_tune_cfg_travels_with_the_model(
    pm: Any, cap: Any, digits_cnn: Any, calib_loader: Any
) -> None:
    cfg = tune_cfg(cap, algorithm="kl")
    qnet = pm.quantize("mxnet", digits_cnn, cfg, calib_loader)
    info = info_of(qnet)
    assert info is not None and info.precision == "int8"
    assert lpq.TuneConfig.from_json(json.loads(json.dumps(info.tune_cfg))) == cfg


def test_bad_configs_are_config_errors(
    pm: Any, cap: Any, digits_cnn: Any, calib_loader: Any
) -> None:
    cfg = tune_cfg(cap)
    with pytest.raises(lpq.ConfigError, match="post-training"):
        pm.quantize("mxnet", digits_cnn, cfg, calib_loader, train_func=lambda m: m)
    unknown = cfg.with_ops({("no_such_conv", "Convolution"): cfg.ops[next(iter(cfg.ops))]})
    with pytest.raises(lpq.ConfigError, match="no_such_conv"):
        pm.quantize("mxnet", digits_cnn, unknown, calib_loader)
    key = next(iter(cfg.ops))
    dynamic = cfg.with_ops({key: replace(cfg.ops[key], mode="dynamic")})
    with pytest.raises(lpq.ConfigError, match="static int8"):
        pm.quantize("mxnet", digits_cnn, dynamic, calib_loader)


def test_quantizing_needs_calibration_data_and_an_fp32_model(
    pm: Any, cap: Any, digits_cnn: Any, calib_loader: Any
) -> None:
    with pytest.raises(lpq.DataError, match="calibration"):
        pm.quantize("mxnet", digits_cnn, tune_cfg(cap), None)
    qnet = pm.quantize("mxnet", digits_cnn, tune_cfg(cap), calib_loader)
    with pytest.raises(lpq.ModelError, match="already quantized"):
        pm.quantize("mxnet", qnet, tune_cfg(cap), calib_loader)


def test_the_fidelity_gates_timing_rounds_read_an_exported_model_once(
    pm: Any, cap: Any, exported: Any, calib_loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate times fp32 and int8 in alternating rounds, one ``evaluate`` each per
    round; inside its ``lpq.runtimes_kept`` scope an exported fp32 model is read and
    made a block once, not once per round."""
    from lpq.eval import fidelity
    from lpq_mxnet import evaluate as evaluate_module

    qnet = pm.quantize("mxnet", str(exported), tune_cfg(cap), calib_loader)
    read: list[Any] = []
    to_graph = evaluate_module.to_graph

    def counted(model: Any, example: Any = None) -> Any:
        read.append(model)
        return to_graph(model, example)

    monkeypatch.setattr(evaluate_module, "to_graph", counted)
    data = lpq.ArrayLoader(calib_loader.inputs[:8], batch_size=8)
    batch, (fp32_ms, int8_ms) = fidelity._timed(pm, "mxnet", str(exported), qnet, data, 1)
    assert batch == 1 and fp32_ms and int8_ms
    assert fidelity._TIMING_ROUNDS > 1 and read == [str(exported)]
