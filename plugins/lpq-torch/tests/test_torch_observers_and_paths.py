"""Observers, calibration budget, QAT with batch norm, inspection and .pt2 paths (CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch_testmodels import calib_loader, digits, eval_loader

import lpq
from lpq import TopK


def default_cfg(cap: lpq.FrameworkCapability, size: int = 200) -> lpq.TuneConfig:
    return lpq.TuneConfig({k: cap.default_op_config(k) for k in cap.opwise}, size)


def test_percentile_observer_clips_outliers_that_minmax_keeps() -> None:
    from torchao.quantization.pt2e import MinMaxObserver

    from lpq_torch.calibration import PercentileObserver

    values = torch.cat([torch.rand(100_000), torch.tensor([50.0])])  # one outlier
    pct = PercentileObserver(dtype=torch.uint8, quant_min=0, quant_max=255)
    mm = MinMaxObserver(dtype=torch.uint8, quant_min=0, quant_max=255)
    pct(values)
    mm(values)
    pct_scale, pct_zp = pct.calculate_qparams()
    mm_scale, _ = mm.calculate_qparams()
    assert float(mm_scale) > 0.19  # 50 / 255: the outlier sets the range
    assert float(pct_scale) < 0.01  # about 1 / 255: clipped at the 99.99th percentile
    assert int(pct_zp) == 0


def test_dtype_ranges() -> None:
    from lpq_torch.qspec import dtype_range

    assert dtype_range("int8") == (torch.int8, -128, 127)
    assert dtype_range("uint4") == (torch.uint8, 0, 15)
    assert dtype_range("int2") == (torch.int8, -2, 1)
    try:
        dtype_range("fp8_e4m3")
    except lpq.ConfigError as exc:
        assert "fp8_e4m3" in str(exc)
    else:
        raise AssertionError("fp8 should be refused")


class CountingLoader:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches = 0

    def __iter__(self) -> Any:
        for item in self.inner:
            self.batches += 1
            yield item


def test_calibration_uses_at_most_calib_sampling_size(digits_convnet: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_convnet, calib_loader())
    loader = CountingLoader(calib_loader(batch=10))  # 20 batches of 10
    pm.quantize("torch", digits_convnet, default_cfg(cap, size=30), loader)
    # One batch for the export example, then 3 batches (30 samples) of calibration.
    assert loader.batches == 1 + 3


def test_qat_int8_with_batch_norm_folds_and_keeps_accuracy(
    digits_convnet: torch.nn.Module,
) -> None:
    model = digits_convnet  # QAT trains a deep copy; the fixture stays untouched
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", model, calib_loader())

    def fit(prepared: torch.fx.GraphModule) -> None:
        images, labels = digits("train")
        x, y = torch.from_numpy(images), torch.from_numpy(labels)
        opt = torch.optim.SGD([p for p in prepared.parameters() if p.requires_grad], lr=1e-3)
        for i in range(0, 640, 64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(prepared(x[i : i + 64]), y[i : i + 64]).backward()
            opt.step()

    qat = pm.quantize("torch", model, default_cfg(cap), calib_loader(), train_func=fit)
    assert not [n for n in qat.graph.nodes if "batch_norm" in str(n.target)]
    fp32 = pm.evaluate("torch", model, eval_loader(), [TopK(1)]).accuracy
    assert pm.evaluate("torch", qat, eval_loader(), [TopK(1)]).accuracy >= fp32 - 0.01


def test_inspected_int8_activations_track_fp32(digits_convnet: torch.nn.Module) -> None:
    pm = lpq.get_plugin_manager()
    cap = pm.query_capability("torch", digits_convnet, calib_loader())
    qmodel = pm.quantize("torch", digits_convnet, default_cfg(cap), calib_loader())
    names = [name for name, _ in cap.opwise]
    fp32 = pm.inspect_tensor("torch", digits_convnet, eval_loader(), names, "activation", 2)
    int8 = pm.inspect_tensor("torch", qmodel, eval_loader(), names, "activation", 2)
    for name in names:
        assert len(fp32.activations[name]) == 2
        a, b = fp32.activations[name][0], int8.activations[name][0]
        rel = np.linalg.norm(a - b) / np.linalg.norm(a)
        # features.0 is followed by batch norm: compared after it, so the error is small.
        assert rel < 0.1, (name, rel)


def test_cli_quantizes_a_pt2_file(
    digits_convnet: torch.nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lpq.cli import main

    # `lpq quantize` is latency-aware (it compiles and times int8 against fp32, which on an
    # 8x8-pixel CNN can keep every op fp32): this test is about the CLI and .pt2 files, so it
    # evaluates eagerly; test_torch_latency.py covers the latency-aware search.
    monkeypatch.setenv("LPQ_TORCH_COMPILE", "0")

    x, y = digits("test")
    program = torch.export.export(
        digits_convnet, (torch.from_numpy(x[:4]),), dynamic_shapes=({0: torch.export.Dim.AUTO},)
    )
    torch.export.save(program, tmp_path / "digits.pt2")
    np.savez(tmp_path / "calib.npz", x=x[:100])
    pm = lpq.get_plugin_manager()
    assert pm.detect_framework(tmp_path / "digits.pt2") == "torch"
    code = main(
        ["quantize", str(tmp_path / "digits.pt2"), "--calib", str(tmp_path / "calib.npz"),
         "--out", str(tmp_path / "digits-int8.pt2")]
    )  # fmt: skip
    assert code == 0
    qmodel = pm.load_model("torch", tmp_path / "digits-int8.pt2")
    assert any("dequantize" in str(n.target) for n in qmodel.graph.nodes)
    data = lpq.ArrayLoader(x, y, 64)
    fp32 = pm.evaluate("torch", digits_convnet, data, [TopK(1)]).accuracy
    assert pm.evaluate("torch", qmodel, data, [TopK(1)]).accuracy >= fp32 - 0.01
