"""Keras fp32 vs float TFLite vs lpq int8 (static, 16x8, dynamic) in LiteRT, one thread.

Latency: a MobileNet-style (keras.applications.MobileNetV2) and a ResNet-style
(keras.applications.ResNet50) net with random weights, batch 1 and 8; every variant of a
model is timed interleaved in one process (each round runs them in a rotated order)
because this machine's timings are noisy: read the ratios. "Keras" is the model compiled
with tf.function (graph mode, TensorFlow's oneDNN kernels, 1 intra-op thread); the other
columns run as .tflite in ai-edge-litert (XNNPACK) with 1 thread, through lpq's
``pm.evaluate``. Also a float .tflite that MediaPipe ships in its wheel (quantized by lpq
through ai-edge-quantizer), and the accuracy of the digits CNN from lpq-tf's tests.

Run:  .venv/bin/python bench/bench_tf.py [--size 128] [--rounds 5] [--iters 3]
Writes bench/results/tf.json and prints a table. The MediaPipe models come from the
installed ``mediapipe`` package if it ships .tflite files, else from the
``mediapipe==0.10.21`` wheel fetched once with ``pip download`` into bench/results/cache.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "lpq-tf" / "tests"))
os.environ["LPQ_TF_THREADS"] = "1"  # every LiteRT interpreter lpq creates: one thread

from lpq_tf.tfenv import import_tf  # noqa: E402

tf = import_tf()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402
from tf_testmodels import calib_loader, config_for, digits_cnn, eval_loader  # noqa: E402

import lpq  # noqa: E402

MEDIAPIPE_WHEEL = "mediapipe==0.10.21"
MEDIAPIPE_MODELS = (
    "hand_landmark_lite",
    "face_landmark",
    "face_detection_short_range",
    "selfie_segmentation",
    "pose_detection",
    "palm_detection_lite",
)
VARIANTS = ("keras", "float", "int8", "16x8", "dynamic")
PRECISIONS = {
    "int8": ("int8", "static"),
    "16x8": ("int16", "static"),
    "dynamic": ("int8", "dynamic"),
}
pm = lpq.get_plugin_manager()


def nets(size: int) -> dict[str, Callable[[], Any]]:
    shape = (size, size, 3)
    return {
        "mobilenet_v2": lambda: keras.applications.MobileNetV2(
            input_shape=shape, weights=None, classifier_activation=None
        ),
        "resnet50": lambda: keras.applications.ResNet50(
            input_shape=shape, weights=None, classifier_activation=None
        ),
    }


def settle_batch_norm(model: Any, images: np.ndarray) -> None:
    """Set every BatchNormalization's moving statistics from one batch of data.

    With random weights and the initial statistics (mean 0, variance 1) activations drift
    to ranges no trained net has, and LiteRT's 16x8 kernels then reject the quantized
    scales; statistics from data make the random net behave like a trained one.
    """
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.0
    model(images, training=True)
    for layer in norms:
        layer.momentum = 0.99


def quantized(model: Any, calib: Any, which: str) -> tuple[Any, list[str]]:
    """lpq's default choices for one precision. When LiteRT has no kernel for an op in
    that precision (lpq names it), keep that op in fp32 and retry, as a user would."""
    capability = pm.query_capability("tf", model, None, {})
    precision, mode = PRECISIONS[which]
    fallbacks: dict[str, str] = {}
    while True:
        try:
            cfg = config_for(capability, precision, mode, **fallbacks)
            return pm.quantize("tf", model, cfg, calib), sorted(fallbacks)
        except lpq.ModelError as exc:
            found = re.search(r"op (\S+) \(", exc.message)
            if found is None or found.group(1) in fallbacks or len(fallbacks) >= 20:
                raise
            fallbacks[found.group(1)] = "fp32"


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median over rounds of each run's ms per batch; each round runs them all, rotated."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(runs[name]())
    return {name: float(np.median(values)) for name, values in times.items()}


def outputs(model: Any, batch: np.ndarray) -> np.ndarray:
    """The model's (first) output for one batch, through pm.evaluate."""
    recorder: list[np.ndarray] = []

    class Keep:
        name, higher_is_better = "keep", True

        def reset(self) -> None:
            recorder.clear()

        def update(self, preds: Any, labels: Any) -> None:
            recorder.append(np.asarray(preds[0] if isinstance(preds, list) else preds))

        def result(self) -> float:
            return 0.0

    pm.evaluate("tf", model, lpq.ArrayLoader(batch, batch_size=len(batch)), [Keep()])
    return recorder[0]


def rel_error(reference: np.ndarray, other: np.ndarray) -> float:
    return float(np.linalg.norm(other - reference) / np.linalg.norm(reference))


def litert_run(model: Any, batch: np.ndarray, iters: int) -> Callable[[], float]:
    """One call: ``iters`` + 1 batches through pm.evaluate, as the tuner measures: the
    first (XNNPACK packs weights on it) is ignored; the median of the others, in ms."""
    data = lpq.ArrayLoader(np.concatenate([batch] * (iters + 1)), batch_size=len(batch))

    def run() -> float:
        measurer = lpq.LatencyMeasurer(warmup=1)
        pm.evaluate("tf", model, data, [], measurer=measurer)
        assert measurer.median_ms is not None
        return measurer.median_ms

    return run


def keras_run(model: Any, batch: np.ndarray, iters: int) -> Callable[[], float]:
    """The Keras model as a tf.function graph; traced once, then the median of ``iters``."""
    graph = tf.function(lambda x: model(x, training=False))
    tensor = tf.constant(batch)
    graph(tensor).numpy()

    def run() -> float:
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            graph(tensor).numpy()
            times.append((time.perf_counter() - start) * 1000)
        return float(np.median(times))

    return run


def latency_rows(size: int, rounds: int, iters: int, workdir: Path) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for name, build in nets(size).items():
        keras.utils.set_random_seed(0)
        model = build()
        settle_batch_norm(model, rng.random((16, size, size, 3), dtype=np.float32))
        calib = lpq.ArrayLoader(rng.random((32, size, size, 3), dtype=np.float32), batch_size=8)
        start = time.perf_counter()
        made = {which: quantized(model, calib, which) for which in PRECISIONS}
        models = {which: qmodel for which, (qmodel, _) in made.items()}
        prepare_s = time.perf_counter() - start
        found = {w: pm.quantized_ops("tf", m) for w, m in models.items()}
        float_file = pm.save_model("tf", model, workdir / f"{name}-float.tflite")
        for batch_size in (1, 8):
            batch = rng.random((batch_size, size, size, 3), dtype=np.float32)
            runs = {
                "keras": keras_run(model, batch, iters),
                # The float .tflite file: pm.evaluate on the Keras model would time the
                # faster of Keras and LiteRT (lpq's fp32 baseline), not LiteRT alone.
                "float": litert_run(float_file, batch, iters),
            }
            runs.update({w: litert_run(m, batch, iters) for w, m in models.items()})
            ms = interleaved(runs, rounds)
            reference = outputs(float_file, batch)
            errors = {w: rel_error(reference, outputs(m, batch)) for w, m in models.items()}
            row = {
                "model": name,
                "input": f"{size}x{size}x3",
                "batch": batch_size,
                **{f"{k}_ms": v for k, v in ms.items()},
                "int8_vs_float": ms["float"] / ms["int8"],
                "int8_vs_keras": ms["keras"] / ms["int8"],
                "ops_int8": {w: sum(p != "fp32" for p in f.values()) for w, f in found.items()},
                "ops_total": len(found["int8"]),
                "rel_l2_error_vs_float": errors,
                "kept_fp32_no_kernel": {w: fb for w, (_, fb) in made.items() if fb},
                "quantize_s": prepare_s,
            }
            rows.append(row)
            print(
                f"  {name} batch {batch_size}: "
                + ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items())
                + f"; int8 {row['int8_vs_float']:.2f}x float",
                flush=True,
            )
    return rows


def mediapipe_models() -> dict[str, Path]:
    """Float .tflite files from the mediapipe package or its wheel (fetched once)."""
    try:
        import mediapipe

        folder = Path(mediapipe.__file__).parent
        found = {p.stem: p for p in folder.rglob("*.tflite") if p.stem in MEDIAPIPE_MODELS}
        if found:
            return found
    except ImportError:
        pass
    cache = ROOT / "bench" / "results" / "cache"
    wheels = sorted(cache.glob("mediapipe-0.10.21-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             MEDIAPIPE_WHEEL, "-d", str(cache)],
            check=True,
        )  # fmt: skip
        wheels = sorted(cache.glob("mediapipe-0.10.21-*.whl"))
    found = {}
    with zipfile.ZipFile(wheels[0]) as wheel:
        for info in wheel.infolist():
            stem = Path(info.filename).stem
            if info.filename.endswith(".tflite") and stem in MEDIAPIPE_MODELS:
                target = cache / "models" / Path(info.filename).name
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(info))
                found[stem] = target
    return found


def mediapipe_rows(rounds: int, iters: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for name, path in mediapipe_models().items():
        from lpq_tf.model_io import prepare
        from lpq_tf.runtime import Runner

        shape = Runner(prepare(path).float_tflite).specs[0].shape
        calib = lpq.ArrayLoader(rng.random((32, *shape[1:]), dtype=np.float32), batch_size=1)
        int8, kept = quantized(path, calib, "int8")
        found = pm.quantized_ops("tf", int8)
        batch = rng.random((1, *shape[1:]), dtype=np.float32)
        error = rel_error(outputs(path, batch), outputs(int8, batch))
        ms = interleaved(
            {"float": litert_run(path, batch, iters), "int8": litert_run(int8, batch, iters)},
            rounds,
        )
        rows.append(
            {
                "model": f"mediapipe {name}",
                "input": "x".join(str(d) for d in shape[1:]),
                "batch": 1,
                "float_ms": ms["float"],
                "int8_ms": ms["int8"],
                "int8_vs_float": ms["float"] / ms["int8"],
                "ops_int8": sum(p != "fp32" for p in found.values()),
                "ops_total": len(found),
                "kept_fp32_no_kernel": kept,
                "rel_l2_error_vs_float": error,
            }
        )
        print(f"  {name}: float {ms['float']:.2f} ms, int8 {ms['int8']:.2f} ms", flush=True)
    return rows


def accuracy_rows() -> list[dict[str, Any]]:
    model = digits_cnn()
    capability = pm.query_capability("tf", model, None, {})
    fp32 = pm.evaluate("tf", model, eval_loader(), [lpq.TopK(1)]).accuracy
    rows = []
    for which, (precision, mode) in PRECISIONS.items():
        qmodel = pm.quantize("tf", model, config_for(capability, precision, mode), calib_loader())
        top1 = pm.evaluate("tf", qmodel, eval_loader(), [lpq.TopK(1)]).accuracy
        rows.append({"quantization": which, "fp32_top1": fp32, "top1": top1, "delta": top1 - fp32})
    return rows


def print_tables(latency: list[dict[str, Any]], real: list[dict[str, Any]], acc: list[Any]) -> None:
    print(
        "\n| model | batch | "
        + " | ".join(f"{v} ms" for v in VARIANTS)
        + " | int8 vs float | int8 rel. error |"
    )
    print("|---|---|" + "---|" * len(VARIANTS) + "---|---|")
    for r in latency:
        cells = " | ".join(f"{r[f'{v}_ms']:.2f}" for v in VARIANTS)
        print(
            f"| {r['model']} {r['input']} | {r['batch']} | {cells} | "
            f"{r['int8_vs_float']:.2f}x | {r['rel_l2_error_vs_float']['int8']:.3f} |"
        )
    for r in real:
        print(
            f"| {r['model']} {r['input']} | 1 | - | {r['float_ms']:.2f} | {r['int8_ms']:.2f} "
            f"| - | - | {r['int8_vs_float']:.2f}x | {r['rel_l2_error_vs_float']:.3f} |"
        )
    print("\n| digits CNN | fp32 top-1 | top-1 | delta |")
    print("|---|---|---|---|")
    for r in acc:
        print(
            f"| {r['quantization']} | {r['fp32_top1']:.4f} | {r['top1']:.4f} | {r['delta']:+.4f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128, help="input height and width")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=3, help="timed batches per call")
    parser.add_argument("--no-mediapipe", action="store_true")
    parser.add_argument("--no-nets", action="store_true", help="skip the Keras nets")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tf.json")
    args = parser.parse_args()
    print(f"tensorflow {tf.__version__}, keras {keras.__version__}, 1 thread", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        latency = (
            [] if args.no_nets else latency_rows(args.size, args.rounds, args.iters, Path(workdir))
        )
    real = [] if args.no_mediapipe else mediapipe_rows(args.rounds * 2, args.iters)
    accuracy = accuracy_rows()
    print_tables(latency, real, accuracy)
    lpq.write_json(
        args.out,
        {
            "framework": "tf",
            "tensorflow": tf.__version__,
            "ai_edge_litert": lpq.installed_version("ai-edge-litert"),
            "machine": platform.machine(),
            "load": os.getloadavg(),
            "threads": 1,
            "method": "keras: tf.function graph; float/int8/16x8/dynamic: .tflite in "
            "ai-edge-litert via pm.evaluate (first batch of each call ignored); lpq default "
            "choices per precision; median over interleaved rounds of per-call medians",
            "rounds": args.rounds,
            "iters_per_call": args.iters,
            "latency": latency,
            "mediapipe": real,
            "accuracy": accuracy,
        },
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
