"""fp32 vs lpq int8 on MXNet 1.9 (oneDNN, x86 CPU), through lpq's public API.

Latency: Gluon model zoo ResNet-18 v1, MobileNet v1 1.0 and MobileNet v2 1.0 (random
init, ``pretrained=False``: nothing is downloaded), 3x224x224 inputs, batch 1 and 16.
fp32 runs hybridized with ``static_alloc`` / ``static_shape`` (lpq-mxnet evaluates every
model that way), int8 is lpq's default tune_cfg through ``quantize_net_v2``. The two are
timed interleaved in one process (rounds alternate between them), because this machine's
timings are noisy: the ratio is what to read. Each round's first batch is a warm-up and
not counted. Accuracy: the digits CNN of the lpq-mxnet tests, fp32 vs int8 top-1.

Run (MXNet needs its own environment, see scripts/setup_mxnet.sh):
    .venv-mxnet/bin/python bench/bench_mxnet.py [--rounds 8] [--iters 6]
Writes bench/results/mxnet.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "lpq-mxnet" / "tests"))

import mxnet as mx  # noqa: E402
from mxnet.gluon.model_zoo import vision  # noqa: E402

import lpq  # noqa: E402

MODELS = {
    "resnet18_v1": "ResNet-18 v1",
    "mobilenet1.0": "MobileNet v1",
    "mobilenetv2_1.0": "MobileNet v2",
}


def default_int8(pm: lpq.PluginManager, model: Any, calib: Any) -> Any:
    cap = pm.query_capability("mxnet", model, calib, {})
    cfg = lpq.TuneConfig({key: cap.default_op_config(key) for key in cap.opwise}, 32)
    return pm.quantize("mxnet", model, cfg, calib)


def interleaved(
    pm: lpq.PluginManager, models: dict[str, Any], data: Any, rounds: int
) -> dict[str, list[float]]:
    """Per-batch seconds of each model, rounds alternating between the models."""
    samples: dict[str, list[float]] = {kind: [] for kind in models}
    for _ in range(rounds):
        for kind, model in models.items():
            measurer = lpq.LatencyMeasurer(warmup=1)
            pm.evaluate("mxnet", model, data, [], measurer=measurer)
            samples[kind].extend(measurer.samples)
    return samples


def latency_rows(pm: lpq.PluginManager, rounds: int, iters: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for name, title in MODELS.items():
        mx.random.seed(0)
        fp32 = vision.get_model(name, pretrained=False)
        fp32.initialize(mx.init.Xavier())
        calib = lpq.ArrayLoader(rng.random((32, 3, 224, 224), dtype=np.float32), None, 16)
        start = time.perf_counter()
        int8 = default_int8(pm, fp32, calib)
        quantize_s = time.perf_counter() - start
        ops = pm.quantized_ops("mxnet", int8)
        for batch in (1, 16):
            data = lpq.ArrayLoader(
                rng.random((batch * (iters + 1), 3, 224, 224), dtype=np.float32), None, batch
            )
            samples = interleaved(pm, {"fp32": fp32, "int8": int8}, data, rounds)
            f, q = (float(np.median(samples[k])) * 1e3 for k in ("fp32", "int8"))
            rows.append(
                {
                    "model": title,
                    "zoo_name": name,
                    "batch": batch,
                    "fp32_ms": f,
                    "int8_ms": q,
                    "speedup": f / q,
                    "timed_batches": len(samples["int8"]),
                    "quantize_s": quantize_s,
                    "int8_ops": sum(p == "int8" for p in ops.values()),
                    "ops": len(ops),
                }
            )
            print(
                f"  {title} batch {batch}: fp32 {f:.2f} ms, int8 {q:.2f} ms, {f / q:.2f}x "
                f"({rows[-1]['int8_ops']}/{len(ops)} ops int8)",
                flush=True,
            )
    return rows


def accuracy_row(pm: lpq.PluginManager) -> dict[str, Any]:
    """The digits CNN from the lpq-mxnet tests, trained here the same way."""
    from mxnet_testmodels import digits_split, train_digits_cnn

    digits = digits_split()
    net = train_digits_cnn(digits)
    calib = lpq.ArrayLoader(digits["train_x"][:200], None, 50)
    data = lpq.ArrayLoader(digits["test_x"], digits["test_y"], 100)
    int8 = default_int8(pm, net, calib)
    top1 = pm.create_metric("top1")
    fp32_acc = pm.evaluate("mxnet", net, data, [top1]).accuracy
    int8_acc = pm.evaluate("mxnet", int8, data, [top1]).accuracy
    return {"model": "digits CNN", "fp32_top1": fp32_acc, "int8_top1": int8_acc,
            "delta": int8_acc - fp32_acc}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iters", type=int, default=6, help="timed batches per round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mxnet.json")
    args = parser.parse_args()
    pm = lpq.get_plugin_manager()
    load = os.getloadavg()
    print(f"mxnet {mx.__version__}, load average {load[0]:.2f}", flush=True)
    latency = latency_rows(pm, args.rounds, args.iters)
    accuracy = accuracy_row(pm)

    print("\n| model | batch | fp32 ms | int8 ms | speedup | ops int8 |")
    print("|---|---|---|---|---|---|")
    for r in latency:
        print(
            f"| {r['model']} | {r['batch']} | {r['fp32_ms']:.2f} | {r['int8_ms']:.2f} | "
            f"{r['speedup']:.2f}x | {r['int8_ops']}/{r['ops']} |"
        )
    print("\n| model | fp32 top-1 | int8 top-1 | delta |")
    print("|---|---|---|---|")
    a = accuracy
    print(f"| {a['model']} | {a['fp32_top1']:.4f} | {a['int8_top1']:.4f} | {a['delta']:+.4f} |")
    lpq.write_json(
        args.out,
        {
            "framework": "mxnet",
            "mxnet": mx.__version__,
            "machine": platform.machine(),
            "load_average_at_start": load,
            "method": "lpq default tune_cfg (quantize_net_v2, oneDNN, uint8 activations, "
            "minmax calibration on 32 random images); fp32 and int8 both hybridized with "
            "static_alloc/static_shape; median per-batch latency of interleaved rounds",
            "rounds": args.rounds,
            "iters_per_round": args.iters,
            "latency": latency,
            "accuracy": accuracy,
        },
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
