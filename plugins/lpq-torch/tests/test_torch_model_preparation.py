"""Models shaped like published ones: what users have must quantize, and be reported truly.

Each case met on a real model (MiniLM via AutoModel, torchvision's ResNet, Silero VAD's
TorchScript and conv1d front end, tensors from torch.inference_mode) has a small model of
the same shape here, built in the test. Precisions are read back from the converted model
(``pm.quantized_ops``), never from the tune_cfg that was asked for.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch_testmodels import (
    Conv1dNet,
    MeanPooledEmbedder,
    StreamingVAD,
    TinyResNet,
    calib_loader,
    eval_loader,
    token_loader,
    train,
)

import lpq
from lpq import TopK


def default_cfg(cap: lpq.FrameworkCapability) -> lpq.TuneConfig:
    return lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise}, 64)


def quantize_default(model: Any, data: Any) -> tuple[lpq.FrameworkCapability, Any]:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", model, data)
    return cap, pm.quantize("torch", model, default_cfg(cap), data)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(1), b.flatten(1)).min())


def test_unused_pooler_is_dead_code_not_a_crash() -> None:
    torch.manual_seed(0)
    model = MeanPooledEmbedder().eval()
    data = token_loader()
    cap, qmodel = quantize_default(model, data)
    assert not [name for name, _ in cap.opwise if "pooler" in name], "dead ops are not listed"
    report = lpq.get_plugin_manager().quantized_ops("torch", qmodel)
    assert set(report) == {name for name, _ in cap.opwise}
    # Linears int8; attention matmuls fp32 by default, as in torchao's x86 recipe.
    assert {report[name] for name, t in cap.opwise if t == "linear"} == {"int8"}
    assert {report[name] for name, t in cap.opwise if t == "matmul"} == {"fp32"}
    with torch.no_grad():
        assert cosine(qmodel(**data[0]), model(**data[0])) > 0.95


def test_module_called_twice_like_torchvision_basic_block() -> None:
    torch.manual_seed(0)
    model = TinyResNet().eval()
    data = calib_loader(batch=16)
    cap, qmodel = quantize_default(model, data)
    report = lpq.get_plugin_manager().quantized_ops("torch", qmodel)
    assert report == {name: "int8" for name, _ in cap.opwise}
    # Both calls of each block's ReLU take part in int8 patterns: no float relu is left
    # between a quantized conv and its consumer.
    x = torch.from_numpy(eval_loader().inputs[:8])
    with torch.no_grad():
        assert cosine(qmodel(x), model(x)) > 0.98


def test_conv1d_with_functional_relu_really_runs_int8() -> None:
    torch.manual_seed(0)
    model = train(Conv1dNet(), epochs=6)
    cap, qmodel = quantize_default(model, calib_loader())
    assert [t for _, t in cap.opwise] == ["conv1d"] * 3
    report = lpq.get_plugin_manager().quantized_ops("torch", qmodel)
    assert report == {"conv1": "int8", "conv2": "int8", "final_conv": "int8"}
    # The functional relu is fused into conv1's int8 pattern: its output is quantized.
    relus = [n for n in qmodel.graph.nodes if n.target == torch.ops.aten.relu.default]
    assert relus and all("quantize" in str(next(iter(r.users)).target) for r in relus)
    x = torch.from_numpy(eval_loader().inputs)
    with torch.no_grad():
        assert not torch.equal(qmodel(x), model(x)), "int8 output differs from fp32"
    pm = lpq.get_plugin_manager()
    fp32 = pm.evaluate("torch", model, eval_loader(), [TopK(1)]).accuracy
    assert pm.evaluate("torch", qmodel, eval_loader(), [TopK(1)]).accuracy >= fp32 - 0.02


class BmmAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(x.reshape(x.shape[0], 8, 8))
        mixed = torch.bmm(tokens, tokens.transpose(1, 2)).softmax(-1)
        return self.head(torch.bmm(mixed, tokens).mean(1))


def test_op_the_quantizer_cannot_annotate_is_reported_fp32(monkeypatch: Any) -> None:
    from lpq_torch import graph

    # Plant: lpq lists torch.bmm as a matmul, which the x86 recipe never annotates.
    monkeypatch.setitem(graph.QUANTIZABLE, "aten.bmm.default", "matmul")
    torch.manual_seed(0)
    model = BmmAttention().eval()
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", model, calib_loader())
    bmms = [name for name, t in cap.opwise if t == "matmul"]
    assert len(bmms) == 2
    cfg = default_cfg(cap)
    for name in bmms:  # matmuls default to fp32: plan them int8
        cfg.ops[(name, "matmul")] = cap.op_configs((name, "matmul"))[0]
    assert all(cfg.ops[(name, "matmul")].precision == "int8" for name in bmms), "planned int8"
    qmodel = pm.quantize("torch", model, cfg, calib_loader())
    report = pm.quantized_ops("torch", qmodel)
    assert {name: report[name] for name in bmms} == {name: "fp32" for name in bmms}
    assert report["proj"] == report["head"] == "int8"


def test_torchscript_model_is_converted_and_quantized() -> None:
    torch.manual_seed(0)
    scripted = torch.jit.script(train(Conv1dNet(), epochs=6))
    cap, qmodel = quantize_default(scripted, calib_loader())
    assert len(cap.opwise) == 3
    report = lpq.get_plugin_manager().quantized_ops("torch", qmodel)
    assert set(report.values()) == {"int8"}
    pm = lpq.get_plugin_manager()
    fp32 = pm.evaluate("torch", scripted, eval_loader(), [TopK(1)]).accuracy
    assert pm.evaluate("torch", qmodel, eval_loader(), [TopK(1)]).accuracy >= fp32 - 0.02


def test_torchscript_streaming_state_names_the_construct() -> None:
    scripted = torch.jit.script(StreamingVAD().eval())
    images, labels = eval_loader().inputs, eval_loader().labels
    data = [((torch.from_numpy(images[:8]), 16000), torch.from_numpy(labels[:8]))]
    with pytest.raises(lpq.ModelError) as err:
        lpq.get_plugin_manager().query_capability("torch", scripted, data)
    message = str(err.value)
    assert "prim::If" in message and "prim::SetAttr" in message  # what it cannot convert
    assert "nn.Module" in message and "state_dict" in message  # and what to pass instead
    assert "no signature found" not in message and "exportable" not in message
    # Leaving out an argument the TorchScript forward declares: say which.
    with pytest.raises(lpq.ModelError, match=r"forward\(.*int sr.*pass every argument"):
        lpq.get_plugin_manager().query_capability("torch", scripted, calib_loader())


def test_inference_mode_tensors_are_cloned_and_weights_get_a_clear_hint() -> None:
    torch.manual_seed(0)
    model = Conv1dNet().eval()
    with torch.inference_mode():
        data = [torch.rand(8, 1, 8, 8) for _ in range(3)]
    _cap, qmodel = quantize_default(model, data)
    assert set(lpq.get_plugin_manager().quantized_ops("torch", qmodel).values()) == {"int8"}
    with torch.inference_mode():
        made_inside = Conv1dNet().eval()
    with pytest.raises(lpq.ModelError, match=r"inference_mode.*\n.*torch\.no_grad\(\)"):
        quantize_default(made_inside, calib_loader())


def test_model_is_exported_once_per_run_and_again_after_a_weight_change(
    monkeypatch: Any,
) -> None:
    from lpq_torch import model_io

    calls: list[int] = []
    real = model_io._export

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_io, "_export", counting)
    torch.manual_seed(0)
    model = Conv1dNet().eval()
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", model, calib_loader())
    first = pm.quantize("torch", model, default_cfg(cap), calib_loader())
    pm.quantize("torch", model, default_cfg(cap), calib_loader())
    pm.inspect_tensor("torch", model, calib_loader(), None, "activation", 1)
    assert len(calls) == 1
    with torch.no_grad():
        model.conv1.weight.mul_(2.0)  # an in-place change: the old export is stale
    second = pm.quantize("torch", model, default_cfg(cap), calib_loader())
    assert len(calls) == 2
    x = torch.from_numpy(eval_loader().inputs[:4])
    assert not torch.equal(first(x), second(x))


def test_framework_error_in_prepare_names_the_stage_and_keeps_torchs_message(
    monkeypatch: Any,
) -> None:
    from lpq_torch.quantizer import LpqX86Quantizer

    def broken(self: Any, model: Any) -> Any:
        return [][0]  # what torchao raised on a dead tanh: IndexError

    monkeypatch.setattr(LpqX86Quantizer, "annotate", broken)
    with pytest.raises(lpq.ModelError) as err:
        quantize_default(Conv1dNet().eval(), calib_loader())
    assert "stage 'prepare'" in str(err.value)
    assert "IndexError: list index out of range" in str(err.value)
    assert "dataloader" not in str(err.value)


def test_failure_inside_a_quantized_graph_is_a_model_error_naming_the_op() -> None:
    torch.manual_seed(0)
    model = Conv1dNet().eval()
    _cap, qmodel = quantize_default(model, calib_loader())
    # The first quantized conv1d (lpq runs it as a conv2d: Inductor drops a conv1d's stride).
    conv = next(n for n in qmodel.graph.nodes if n.target == torch.ops.aten.conv2d.default)
    weight_dq = conv.args[1]
    setattr(qmodel, weight_dq.args[0].target, torch.zeros(3, 3, 3, 1, dtype=torch.int8))
    pm = lpq.get_plugin_manager()
    with pytest.raises(lpq.ModelError) as err:
        pm.inspect_tensor("torch", qmodel, calib_loader(), None, "activation", 1)
    assert "stage 'inspect'" in str(err.value) and "op conv1" in str(err.value)
    with pytest.raises(lpq.ModelError, match="stage 'evaluate'"):
        pm.evaluate("torch", qmodel, eval_loader(), [TopK(1)])


def test_compile_failure_falls_back_without_freezing_and_says_so(
    monkeypatch: Any, caplog: Any
) -> None:
    from lpq_torch import evaluate

    real_build = evaluate.Forward._build

    def freezing_breaks(self: Any) -> Any:
        if self.mode == "inductor+freezing":

            def broken(*_args: Any, **_kwargs: Any) -> Any:
                raise RuntimeError("freezing: shapes cannot be broadcast (LSTM cell)")

            return broken
        return real_build(self)

    monkeypatch.setattr(evaluate.Forward, "_build", freezing_breaks)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)).eval()
    data = eval_loader(batch=100)
    with caplog.at_level("WARNING", logger="lpq.torch"):
        result = lpq.get_plugin_manager().evaluate(
            "torch", model, data, [TopK(1)], measurer=lpq.LatencyMeasurer()
        )
    assert result.latency_ms is not None and result.samples == len(data.labels)
    assert "inductor+freezing" in caplog.text and "evaluating with inductor" in caplog.text
    assert "LSTM cell" in caplog.text


def test_minilm_shaped_model_dynamic_int8_reports_linears_int8_and_matmuls_fp32() -> None:
    torch.manual_seed(0)
    model = MeanPooledEmbedder().eval()
    data = token_loader()
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", model, data)
    ops = {}
    for key, caps in cap.opwise.items():
        dynamic = [c for c in caps if c.mode == "dynamic"]
        ops[key] = dynamic[0].default_config() if dynamic else lpq.OpConfig.fallback()
    qmodel = pm.quantize("torch", model, lpq.TuneConfig(ops), data)
    report = pm.quantized_ops("torch", qmodel)
    assert {report[name] for name, t in cap.opwise if t == "linear"} == {"int8"}
    assert {report[name] for name, t in cap.opwise if t == "matmul"} == {"fp32"}
    inspected = pm.inspect_tensor("torch", qmodel, data, None, "both", 1)
    assert "model.query" in inspected.activations and "model.query" in inspected.weights
    with torch.no_grad():
        assert cosine(qmodel(**data[0]), model(**data[0])) > 0.98
    timed = pm.evaluate("torch", qmodel, data, [], measurer=lpq.LatencyMeasurer())
    assert timed.latency_ms is not None and timed.latency_ms > 0  # compiled int8 runs
