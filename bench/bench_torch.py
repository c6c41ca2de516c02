"""fp32 vs lpq int8 on PyTorch (x86 CPU), both torch.compile'd, through lpq's public API.

Latency: a conv net (3x32x32 input, conv+bn+relu blocks) and an MLP, at batch 1 and 16.
fp32 and int8 are timed interleaved in one process (rounds alternate between them) because
this machine's timings are noisy; the ratio is what to read. Accuracy: the digits-trained
conv net and MLP from the lpq-torch tests, fp32 vs int8 top-1 on held-out digits.

Run:  .venv/bin/python bench/bench_torch.py [--rounds 10] [--iters 5]
Writes bench/results/torch.json and prints a table.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "lpq-torch" / "tests"))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch_testmodels import (  # noqa: E402
    DigitsConvNet,
    DigitsMLP,
    calib_loader,
    eval_loader,
    train,
)

import lpq  # noqa: E402
from lpq import TopK  # noqa: E402


def conv_net() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, 64),
        *block(64, 64),
        nn.MaxPool2d(2),
        *block(64, 128),
        *block(128, 128),
        nn.MaxPool2d(2),
        *block(128, 256),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(256, 10),
    ).eval()


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    ).eval()


def default_int8(pm: lpq.PluginManager, model: nn.Module, calib: Any) -> Any:
    cap = pm.query_capability("torch", model, calib)
    cfg = lpq.TuneConfig({key: cap.default_op_config(key) for key in cap.opwise}, 64)
    return pm.quantize("torch", model, cfg, calib)


def latency_rows(pm: lpq.PluginManager, rounds: int, iters: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for name, build, shape in (("convnet", conv_net, (3, 32, 32)), ("mlp", mlp, (512,))):
        torch.manual_seed(0)
        fp32 = build()
        calib = lpq.ArrayLoader(rng.standard_normal((64, *shape), dtype=np.float32), None, 16)
        int8 = default_int8(pm, fp32, calib)
        for batch in (1, 16):
            data = lpq.ArrayLoader(
                rng.standard_normal((batch * iters, *shape), dtype=np.float32), None, batch
            )
            measurers = {"fp32": lpq.LatencyMeasurer(0), "int8": lpq.LatencyMeasurer(0)}
            models = {"fp32": fp32, "int8": int8}
            compile_s = {}
            for kind, model in models.items():  # compile + warm up, untimed
                start = time.perf_counter()
                pm.evaluate("torch", model, data, [], measurer=lpq.LatencyMeasurer(), iteration=2)
                compile_s[kind] = time.perf_counter() - start
            for _ in range(rounds):  # interleaved
                for kind, model in models.items():
                    pm.evaluate("torch", model, data, [], measurer=measurers[kind])
            f, q = measurers["fp32"].median_ms, measurers["int8"].median_ms
            assert f is not None and q is not None
            rows.append(
                {
                    "model": name,
                    "batch": batch,
                    "fp32_ms": f,
                    "int8_ms": q,
                    "speedup": f / q,
                    "first_call_s": compile_s,
                }
            )
            print(
                f"  {name} batch {batch}: fp32 {f:.3f} ms, int8 {q:.3f} ms, {f / q:.2f}x",
                flush=True,
            )
    return rows


def accuracy_rows(pm: lpq.PluginManager) -> list[dict[str, Any]]:
    rows = []
    for name, model in (
        ("digits convnet", train(DigitsConvNet(), epochs=8)),
        ("digits mlp", train(DigitsMLP(), epochs=12)),
    ):
        int8 = default_int8(pm, model, calib_loader())
        fp32_acc = pm.evaluate("torch", model, eval_loader(), [TopK(1)]).accuracy
        int8_acc = pm.evaluate("torch", int8, eval_loader(), [TopK(1)]).accuracy
        rows.append(
            {
                "model": name,
                "fp32_top1": fp32_acc,
                "int8_top1": int8_acc,
                "delta": int8_acc - fp32_acc,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iters", type=int, default=5, help="batches per round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "torch.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    pm = lpq.get_plugin_manager()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}", flush=True)
    latency = latency_rows(pm, args.rounds, args.iters)
    accuracy = accuracy_rows(pm)

    print("\n| model | batch | fp32 ms | int8 ms | speedup |")
    print("|---|---|---|---|---|")
    for r in latency:
        print(
            f"| {r['model']} | {r['batch']} | {r['fp32_ms']:.3f} | {r['int8_ms']:.3f} | "
            f"{r['speedup']:.2f}x |"
        )
    print("\n| model | fp32 top-1 | int8 top-1 | delta |")
    print("|---|---|---|---|")
    for r in accuracy:
        print(f"| {r['model']} | {r['fp32_top1']:.4f} | {r['int8_top1']:.4f} | {r['delta']:+.4f} |")
    lpq.write_json(
        args.out,
        {
            "framework": "torch",
            "torch": torch.__version__,
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "method": "lpq default tune_cfg (static int8, X86 PT2E recipe), torch.compile "
            "with Inductor freezing for both fp32 and int8; median of interleaved rounds",
            "rounds": args.rounds,
            "iters_per_round": args.iters,
            "latency": latency,
            "accuracy": accuracy,
        },
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
