"""Backend schemes, MQBench-style: how much accuracy each hardware backend's quantization
rules cost, after PTQ and after QAT, against the unconstrained x86 scheme.

Two digits-trained nets (torch.nn only): a ResNet-style net built here (conv-bn-relu stem,
two residual blocks, global pooling) and the MobileNet-style net of lpq-torch's QAT tests
(depthwise-separable blocks with ReLU6). For every shipped backend profile (tensorrt,
snpe, vitis, openvino, tflite, and x86 as the unconstrained reference) through lpq-torch's
backend simulation:

* PTQ at 8 bits, PTQ at 4 bits and QAT at 4 bits (LSQ, ``--qat-epochs`` epochs of Adam on
  the digits train split): top-1 on the held-out digits and agreement with the fp32 model;
* the 8-bit model deployed (``lpq deploy``'s Python API) and run in ONNX Runtime: the
  largest output difference from the simulation, in quantization steps: ``model.onnx``
  against the simulation, against the simulation with ONNX's rounding (half to even),
  and the exact-rounding export (``exact_rounding=True``) against the simulation.

Run:  .venv/bin/python bench/bench_backends.py [--qat-epochs 2] [--train-epochs 12]
Writes bench/results/backends.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "lpq-torch" / "tests"))

import torch  # noqa: E402
from test_torch_backends_qat import DigitsMobileNet as MobileNetStyle  # noqa: E402
from torch import nn  # noqa: E402
from torch_testmodels import calib_loader, digits, train  # noqa: E402

import lpq  # noqa: E402
from lpq import deploy  # noqa: E402
from lpq_torch.backends import verify  # noqa: E402
from lpq_torch.backends.profiles import PROFILES  # noqa: E402
from lpq_torch.backends.quantize import quantize_for_backend  # noqa: E402


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNetStyle(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.layer1 = ResidualBlock(width, width, 1)
        self.layer2 = ResidualBlock(width, 2 * width, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def predictions(model: nn.Module, images: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(images)).argmax(1).numpy()


def qat_trainer(epochs: int, lr: float = 1e-3) -> Any:
    def train_func(model: nn.Module) -> nn.Module:
        images, labels = digits("train")
        x, y = torch.from_numpy(images), torch.from_numpy(labels)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        generator = torch.Generator().manual_seed(0)
        for _ in range(epochs):
            order = torch.randperm(len(y), generator=generator)
            for start in range(0, len(y), 64):
                batch = order[start : start + 64]
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
                optimizer.step()
        return model

    return train_func


def run(train_epochs: int, qat_epochs: int, backends: list[str]) -> dict[str, Any]:
    images, labels = digits("test")
    results: dict[str, Any] = {}
    for name, factory in (("resnet", ResNetStyle), ("mobilenet", MobileNetStyle)):
        torch.manual_seed(0)
        model = train(factory(), epochs=train_epochs, lr=3e-3)
        reference = predictions(model, images)
        rows: dict[str, Any] = {"fp32": float((reference == labels).mean())}
        for backend in backends:
            started = time.perf_counter()
            row: dict[str, Any] = {}
            for label, bits, trainer in (
                ("ptq8", None, None),
                ("ptq4", 4, None),
                ("qat4", 4, qat_trainer(qat_epochs)),
            ):
                sim = quantize_for_backend(model, backend, calib_loader(), trainer, bits=bits)
                predicted = predictions(sim, images)
                row[label] = float((predicted == labels).mean())
                row[f"{label}_agreement"] = float((predicted == reference).mean())
            with tempfile.TemporaryDirectory() as out:
                deployed = deploy(model, backend, out, calib_loader())
                own = verify.compare(deployed.model, deployed.onnx_model, [images])
                even = verify.compare(
                    deployed.model, deployed.onnx_model, [images], round_mode="half_even"
                )
                exact_model = lpq.get_plugin_manager().convert(
                    "torch", deployed.model, "onnx", {"exact_rounding": True}
                )
                exact = verify.compare(deployed.model, exact_model, [images])
            row["ort_steps"] = own["max_steps"]
            row["ort_steps_onnx_rounding"] = even["max_steps"]
            row["ort_steps_exact_rounding_model"] = exact["max_steps"]
            row["ort_max_code_diff_exact_rounding_model"] = exact["max_code_diff"]
            row["ort_max_code_diff_isolated"] = own["max_code_diff"]
            row["seconds"] = time.perf_counter() - started
            rows[backend] = row
            print(f"  {name} {backend}: {row}", flush=True)
        results[name] = rows
    return results


def table(results: dict[str, Any], backends: list[str]) -> str:
    lines = [
        "| model | backend | PTQ int8 | PTQ 4-bit | QAT 4-bit | ORT vs sim: model.onnx "
        "| sim with ONNX rounding | exact-rounding model |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        lines.append(f"| {name} | fp32 | {rows['fp32']:.4f} | | | | | |")
        for backend in backends:
            r = rows[backend]
            lines.append(
                f"| {name} | {backend} | {r['ptq8']:.4f} | {r['ptq4']:.4f} | {r['qat4']:.4f} "
                f"| {r['ort_steps']:.2f} | {r['ort_steps_onnx_rounding']:.2f} "
                f"| {r['ort_steps_exact_rounding_model']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-epochs", type=int, default=12)
    parser.add_argument("--qat-epochs", type=int, default=2)
    parser.add_argument("--backends", default=",".join(PROFILES))
    args = parser.parse_args()
    torch.set_num_threads(2)
    backends = args.backends.split(",")
    started = time.perf_counter()
    results = run(args.train_epochs, args.qat_epochs, backends)
    text = table(results, backends)
    print(text)
    out = ROOT / "bench" / "results" / "backends.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    out.write_text(
        json.dumps(
            {
                "results": results,
                "table": text,
                "train_epochs": args.train_epochs,
                "qat_epochs": args.qat_epochs,
                "torch": torch.__version__,
                "machine": platform.platform(),
                "load_average": load,
                "seconds": time.perf_counter() - started,
            },
            indent=2,
        )
    )
    print(f"wrote {out} (load average {load[0]:.1f}, {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
