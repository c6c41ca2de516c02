"""`lpq deploy` and the tuner with backend profiles: the command line, tuning under a
backend's constraints, ops a backend keeps in float, and user mistakes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_torch_backends_profiles import assert_faithful
from torch import nn
from torch_testmodels import TinyTransformer, calib_loader, digits, eval_loader

import lpq
from lpq.cli import main
from lpq.cli.deploy import deploy


def test_lpq_deploy_writes_the_backends_files(
    digits_convnet: nn.Module, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images, _ = digits("train")
    pm = lpq.get_plugin_manager()
    pm.query_capability("torch", digits_convnet, calib_loader())  # example inputs to export
    model_file = pm.save_model("torch", digits_convnet, tmp_path / "digits.pt2")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=images[:200])
    out = tmp_path / "trt"
    code = main(
        [
            "deploy",
            str(model_file),
            "--backend",
            "tensorrt",
            "--calib",
            str(calib),
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    manifest = json.loads((out / "deploy.json").read_text())
    assert manifest["backend"] == "tensorrt" and manifest["framework"] == "torch"
    for name in ("model.onnx", "model_fp32.onnx", "calibration.cache", "dynamic_ranges.json"):
        assert (out / name).is_file() and name in manifest["files"] and name in printed
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    test_images, test_labels = digits("test")
    predicted = session.run(None, {session.get_inputs()[0].name: test_images})[0].argmax(1)
    assert float((predicted == test_labels).mean()) > 0.95


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "nope", "--calib", "{calib}"], "unknown backend profile 'nope'"),
        (["--backend", "tensorrt"], "needs calibration data"),
        (
            ["--backend", "onnxrt-cpu", "--calib", "{calib}"],
            "is for onnxrt models, but this is a torch",
        ),
    ],
)
def test_lpq_deploy_mistakes_are_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    model_file = tmp_path / "m.pt2"
    model_file.write_bytes(b"PK\x03\x04 not really")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.zeros((4, 1, 8, 8), np.float32))
    args = [a.replace("{calib}", str(calib)) for a in args]
    code = main(["deploy", str(model_file), *args, "--out", str(tmp_path / "out")])
    assert code == 2
    assert message in capsys.readouterr().err


def test_tuning_for_a_backend_then_deploying_the_result(
    digits_convnet: nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LPQ_TORCH_COMPILE", "0")  # the fp32 baseline's timing: no compile
    conf = lpq.PostTrainingQuantConfig(
        backend="vitis",
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.02),
        tuning_criterion=lpq.TuningCriterion(max_trials=4),
    )
    result = lpq.fit(
        digits_convnet,
        conf,
        calib_loader(),
        eval_dataloader=eval_loader(),
        eval_metric="top1",
        workspace=tmp_path / "ws",
    )
    assert result.goal_met
    for trial in result.trials:
        cfg = trial.config()
        assert cfg is not None and cfg.options["backend"] == "vitis"
        for op in cfg.ops.values():
            if op.quantized:
                assert op.weight is not None and op.weight.granularity == "per_tensor"
                assert op.activation is not None and op.activation.scheme == "sym"
    deployed = deploy(result, "vitis", tmp_path / "out")
    assert (tmp_path / "out" / "fix_points.json").is_file()
    images, _ = digits("test")
    assert_faithful(deployed, [images[:128]], "vitis")


def test_a_backend_keeps_its_float_ops_in_float(tmp_path: Path) -> None:
    """Vitis AI runs matmul, softmax, layer norm and GELU on the CPU: the tuning space
    pins matmul to fp32, the simulation leaves those ops unquantized, and the transformer
    still exports and matches ONNX Runtime."""
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    pm = lpq.get_plugin_manager()
    quantized = lpq.quantize(model, lpq.PostTrainingQuantConfig(backend="vitis"), calib_loader())
    matmuls = {
        name: cfg for (name, op_type), cfg in quantized.tune_cfg.ops.items() if op_type == "matmul"
    }
    assert matmuls and all(not cfg.quantized for cfg in matmuls.values())
    precisions = pm.quantized_ops("torch", quantized.model)
    assert {precisions[name] for name in matmuls} == {"fp32"}
    assert precisions["qkv"] == precisions["head"] == "int8"
    result = deploy(quantized, "vitis", tmp_path)
    images, _ = digits("test")
    assert_faithful(result, [images[:64]], "vitis")
    # On SNPE/QNN every op is integer, matmul too.
    snpe = lpq.quantize(model, lpq.PostTrainingQuantConfig(backend="snpe"), calib_loader())
    assert {pm.quantized_ops("torch", snpe.model)[name] for name in matmuls} == {"int8"}


def test_a_simulated_model_saves_and_loads(digits_convnet: nn.Module, tmp_path: Path) -> None:
    pm = lpq.get_plugin_manager()
    quantized = lpq.quantize(
        digits_convnet, lpq.PostTrainingQuantConfig(backend="snpe"), calib_loader()
    )
    path = quantized.save(tmp_path / "snpe.pt2")
    loaded = pm.load_model("torch", path)
    images, _ = digits("test")
    with torch.no_grad():
        x = torch.from_numpy(images[:64])
        assert torch.equal(loaded(x), quantized.model(x))
