"""Quantization-aware training under backend schemes: QAT at 4 bits beats PTQ at 4 bits
(Vitis AI and TensorRT rules), PACT and LSQ+ quantizers learn and freeze to what the
backend represents, and a QAT model deploys faithfully."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_torch_backends_profiles import assert_faithful
from torch import nn
from torch_testmodels import calib_loader, digits, train

import lpq
from lpq.cli.deploy import deploy
from lpq_torch.backends import simulate
from lpq_torch.backends.profiles import scheme_of
from lpq_torch.backends.quantize import default_tune_cfg, quantize_for_backend


class DigitsMobileNet(nn.Module):
    """MobileNet-style: depthwise-separable convs with batch norm and ReLU6. Folding batch
    norm into depthwise convs spreads their per-channel ranges, which 4-bit per-tensor
    weights (Vitis AI) cannot cover without training."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()

        def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
            return [
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
                nn.BatchNorm2d(cin),
                nn.ReLU6(),
                nn.Conv2d(cin, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU6(),
            ]

        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU6(),
            *block(width, 2 * width, 1),
            *block(2 * width, 2 * width, 2)[0:3],
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(2 * width, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


@pytest.fixture(scope="module")
def mobilenet() -> nn.Module:
    torch.manual_seed(0)
    return train(DigitsMobileNet(), epochs=4, lr=1e-2)


def accuracy(model: nn.Module) -> float:
    images, labels = digits("test")
    with torch.no_grad():
        predicted = model(torch.from_numpy(images)).argmax(1).numpy()
    return float((predicted == labels).mean())


def trainer(
    epochs: int = 1, lr: float = 2e-3, steps: int | None = None
) -> Callable[..., nn.Module]:
    """A train_func: Adam on the digits train split (weights and quantizers together)."""

    def train_func(model: nn.Module) -> nn.Module:
        images, labels = digits("train")
        x, y = torch.from_numpy(images), torch.from_numpy(labels)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        generator = torch.Generator().manual_seed(0)
        done = 0
        for _ in range(epochs):
            order = torch.randperm(len(y), generator=generator)
            for start in range(0, len(y), 64):
                if steps is not None and done >= steps:
                    return model
                batch = order[start : start + 64]
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
                optimizer.step()
                done += 1
        return model

    return train_func


@pytest.mark.parametrize("backend", ["vitis", "tensorrt"])
def test_qat_at_4_bits_beats_ptq_at_4_bits(mobilenet: nn.Module, backend: str) -> None:
    fp32 = accuracy(mobilenet)
    assert fp32 > 0.9
    ptq = quantize_for_backend(mobilenet, backend, calib_loader(), bits=4)
    qat = quantize_for_backend(mobilenet, backend, calib_loader(), trainer(steps=12), bits=4)
    ptq_accuracy, qat_accuracy = accuracy(ptq), accuracy(qat)
    assert qat_accuracy > ptq_accuracy + 0.02, (ptq_accuracy, qat_accuracy)
    # Still the backend's arithmetic at 4 bits after training.
    for name, quantizer in simulate.quantizers(qat).items():
        assert quantizer.mode == "quantize" and quantizer.spec.qmax <= 15, name
        if backend == "vitis":
            exponent = torch.log2(quantizer.scale)
            assert torch.all(exponent == torch.round(exponent)), name


def test_pact_learns_its_clip_and_the_qat_model_deploys(
    mobilenet: nn.Module, tmp_path: Path
) -> None:
    """Vitis AI at 8 bits with PACT activations: the clip levels learn, freeze to powers
    of two, and deploy of the trained model is faithful."""
    moved: list[str] = []

    def train_func(model: nn.Module) -> nn.Module:
        quantizers = simulate.quantizers(model)
        before = {n: q.alpha.detach().clone() for n, q in quantizers.items() if q.alpha is not None}
        for name, quantizer in quantizers.items():
            assert quantizer.method == ("lsq" if quantizer.weight else "pact"), name
        trainer(steps=4, lr=5e-2)(model)
        moved.extend(n for n, a in before.items() if not torch.equal(a, quantizers[n].alpha))
        return model

    qat = quantize_for_backend(mobilenet, "vitis", calib_loader(), train_func, qat_method="pact")
    assert moved, "PACT clip levels did not learn"
    for name in moved:
        exponent = torch.log2(simulate.quantizers(qat)[name].scale)
        assert torch.all(exponent == torch.round(exponent)), name
    result = deploy(qat, "vitis", tmp_path)  # already quantized: no calibration data
    assert (tmp_path / "fix_points.json").is_file()
    images, _ = digits("test")
    assert_faithful(result, [images[:128]], "vitis")


def test_lsq_plus_learns_integer_zero_points(mobilenet: nn.Module) -> None:
    """TFLite's asymmetric int8 activations with LSQ+: zero points learn, then round."""
    learned: dict[str, float] = {}

    def train_func(model: nn.Module) -> nn.Module:
        trainer(steps=4, lr=5e-2)(model)
        for name, quantizer in simulate.quantizers(model).items():
            if not quantizer.weight:
                assert quantizer.method == "lsq_plus"
                assert quantizer.learned_zero_point is not None
                learned[name] = float(quantizer.learned_zero_point.detach().reshape(-1)[0])
        return model

    # Through lpq's facade, as the tuner calls it: the scheme rides in the tune_cfg.
    pm = lpq.get_plugin_manager()
    ops = pm.query_capability("torch", mobilenet, calib_loader(), {}).opwise
    tune_cfg = default_tune_cfg(ops, scheme_of("tflite"))
    tune_cfg.options.update(backend="tflite", qat_method="lsq_plus")
    qat = pm.quantize("torch", mobilenet, tune_cfg, calib_loader(), train_func)
    assert any(value != round(value) for value in learned.values()), "zero points did not learn"
    for name in learned:
        zero = simulate.quantizers(qat)[name].zero_point
        assert torch.all(zero == torch.round(zero)) and -128 <= float(zero) <= 127


def test_a_model_simulated_with_another_scheme_does_not_deploy(
    mobilenet: nn.Module, tmp_path: Path
) -> None:
    four_bit = quantize_for_backend(mobilenet, "vitis", calib_loader(), bits=4)
    with pytest.raises(lpq.ModelError, match="another scheme"):
        deploy(four_bit, "vitis", tmp_path)
    with pytest.raises(lpq.ModelError, match="not quantized for backend 'tensorrt'"):
        deploy(mobilenet, "tensorrt", tmp_path)
