"""fp32 vs lpq int8 on MXNet 1.9 (oneDNN, x86 CPU).

Latency: Gluon model zoo ResNet-18 v1, MobileNet v1 1.0 and MobileNet v2 1.0 (random
init, ``pretrained=False``: nothing is downloaded), 3x224x224 inputs, batch 1 and 16.
Three variants, timed interleaved in one process (rounds alternate between them) because
this machine's timings are noisy, so the ratios are what to read:

* fp32 hybridized: ``net.hybridize(static_alloc=True, static_shape=True)``;
* fp32 fused: the same plus ``backend="MKLDNN"`` (oneDNN's fp32 conv+bn+act fusions, the
  fastest fp32 MXNet offers and how lpq-mxnet evaluates fp32 models);
* lpq int8: lpq's default tune_cfg through ``pm.quantize`` (``quantize_net_v2``, 32
  random calibration images), re-hybridized static.

Each timed call is ``block(x)`` plus ``mx.nd.waitall()``, after a ``waitall``; each
round's first batch is a warm-up. Accuracy: the digits CNN of the lpq-mxnet tests, fp32
vs int8 top-1 through ``pm.evaluate``.

Run (MXNet needs its own environment, see scripts/setup_mxnet.sh):
    .venv-mxnet/bin/python bench/bench_mxnet.py [--rounds 6] [--iters 5]
Writes bench/results/mxnet.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
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


def timed(block: Any, x: Any, iters: int) -> list[float]:
    """Seconds per call of ``block(x)``, the first (warm-up) call dropped."""
    times = []
    for _ in range(iters + 1):
        mx.nd.waitall()
        start = time.perf_counter()
        block(x)
        mx.nd.waitall()
        times.append(time.perf_counter() - start)
    return times[1:]


def zoo_model(name: str, params: Path | None = None) -> Any:
    mx.random.seed(0)
    net = vision.get_model(name, pretrained=False)
    if params is None:
        net.initialize(mx.init.Xavier())
    else:
        net.load_parameters(str(params))
    return net


def latency_rows(pm: lpq.PluginManager, rounds: int, iters: int, tmp: Path) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for name, title in MODELS.items():
        plain = zoo_model(name)
        plain(mx.nd.zeros((1, 3, 224, 224)))  # finish deferred initialization
        plain.save_parameters(str(tmp / f"{name}.params"))
        fused = zoo_model(name, tmp / f"{name}.params")  # same weights
        calib = lpq.ArrayLoader(rng.random((32, 3, 224, 224), dtype=np.float32), None, 16)
        start = time.perf_counter()
        int8 = default_int8(pm, plain, calib)
        quantize_s = time.perf_counter() - start
        ops = pm.quantized_ops("mxnet", int8)
        plain.hybridize(static_alloc=True, static_shape=True)
        fused.hybridize(static_alloc=True, static_shape=True, backend="MKLDNN")
        variants = {"fp32": plain, "fp32_fused": fused, "int8": int8}
        for batch in (1, 16):
            x = mx.nd.array(rng.random((batch, 3, 224, 224), dtype=np.float32))
            samples: dict[str, list[float]] = {kind: [] for kind in variants}
            for _ in range(rounds):
                for kind, block in variants.items():
                    samples[kind].extend(timed(block, x, iters))
            ms = {kind: float(np.median(v)) * 1e3 for kind, v in samples.items()}
            row = {
                "model": title,
                "zoo_name": name,
                "batch": batch,
                "fp32_ms": ms["fp32"],
                "fp32_fused_ms": ms["fp32_fused"],
                "int8_ms": ms["int8"],
                "speedup": ms["fp32"] / ms["int8"],
                "speedup_vs_fused": ms["fp32_fused"] / ms["int8"],
                "timed_calls": len(samples["int8"]),
                "quantize_s": quantize_s,
                "int8_ops": sum(p == "int8" for p in ops.values()),
                "ops": len(ops),
            }
            rows.append(row)
            print(
                f"  {title} batch {batch}: fp32 {ms['fp32']:.2f} ms, fused fp32 "
                f"{ms['fp32_fused']:.2f} ms, int8 {ms['int8']:.2f} ms: {row['speedup']:.2f}x "
                f"/ {row['speedup_vs_fused']:.2f}x ({row['int8_ops']}/{len(ops)} ops int8)",
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
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iters", type=int, default=5, help="timed calls per round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mxnet.json")
    args = parser.parse_args()
    pm = lpq.get_plugin_manager()
    load = os.getloadavg()
    print(f"mxnet {mx.__version__}, load average {load[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        latency = latency_rows(pm, args.rounds, args.iters, Path(tmp))
    accuracy = accuracy_row(pm)

    print(
        "\n| model | batch | fp32 hybridized ms | fp32 fused ms | lpq int8 ms | "
        "speedup vs hybridized | vs fused | ops int8 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in latency:
        print(
            f"| {r['model']} | {r['batch']} | {r['fp32_ms']:.2f} | {r['fp32_fused_ms']:.2f} | "
            f"{r['int8_ms']:.2f} | **{r['speedup']:.2f}x** | {r['speedup_vs_fused']:.2f}x | "
            f"{r['int8_ops']}/{r['ops']} |"
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
            "minmax calibration on 32 random images) vs fp32 hybridized with static_alloc/"
            "static_shape, without and with backend='MKLDNN'; median per-call latency of "
            "interleaved rounds, block(x) + waitall",
            "rounds": args.rounds,
            "iters_per_round": args.iters,
            "latency": latency,
            "accuracy": accuracy,
        },
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
