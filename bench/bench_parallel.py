"""Parallel and distributed tuning: wall time of N trials with 1 and 2 workers, and the
per-trial overhead of each executor.

Model: the PP-OCRv4 text recognizer shipped in the `rapidocr-onnxruntime` wheel (a real,
published model; installed here with `--no-deps` if missing — only its .onnx file is
read). Inputs: crops of scikit-learn's bundled photos at 3x48x320, normalised as PP-OCR
expects. Accuracy is the cosine similarity of the quantized model's outputs to fp32's.
Every run tunes the same N trials (the `random` strategy with a fixed seed and an
unreachable goal, so no run stops early) and must produce the same trials.

Runs, in one process, interleaved per repeat: serial; process pool with 2 workers; Ray
with 2 workers (a local Ray on 127.0.0.1). Then the overhead of each executor per trial,
measured on the tiny digits model (trials of a few milliseconds): (executor wall time -
serial wall time) / trials, and the executor's start-up.

    .venv/bin/python bench/bench_parallel.py [--trials 16] [--repeats 1]

Prints a table and writes bench/results/parallel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

import lpq


def installed(distribution: str) -> metadata.Distribution:
    """The distribution, installed first (without its dependencies) if missing."""
    try:
        return metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", distribution]
        subprocess.run(pip, check=True)
        return metadata.distribution(distribution)


def recognizer() -> Path:
    installed("pillow")  # scikit-learn reads its bundled photos with it
    dist = installed("rapidocr-onnxruntime")
    for file in dist.files or []:
        if Path(str(file)).name == "ch_PP-OCRv4_rec_infer.onnx":
            return Path(str(dist.locate_file(file)))
    sys.exit("the rapidocr-onnxruntime wheel has no ch_PP-OCRv4_rec_infer.onnx")


def crops(count: int, seed: int) -> np.ndarray:
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = load_sample_images().images
    out = []
    for _ in range(count):
        photo = photos[rng.integers(len(photos))]
        top = rng.integers(0, photo.shape[0] - 48)
        left = rng.integers(0, photo.shape[1] - 320)
        crop = photo[top : top + 48, left : left + 320].astype(np.float32) / 255.0
        out.append(((crop - 0.5) / 0.5).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def tune(
    model: str, calib: Any, evaluation: Any, trials: int, metric: str | None, **tuning: Any
) -> tuple[float, Any]:
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=1e-9),
        tuning_criterion=lpq.TuningCriterion(
            strategy="random", max_trials=trials, exit_policy="best", seed=11, **tuning
        ),
    )
    with tempfile.TemporaryDirectory() as workspace:
        start = time.perf_counter()
        result = lpq.fit(
            model,
            conf,
            calib,
            eval_dataloader=evaluation,
            eval_metric="cosine",
            workspace=workspace,
        )
        return time.perf_counter() - start, result


VARIANTS = {
    "serial": {"workers": 1, "executor": "serial"},
    "process x2": {"workers": 2, "executor": "process"},
    "ray x2": {"workers": 2, "executor": "ray"},
}


def measure(
    model: str, calib: Any, evaluation: Any, trials: int, repeats: int, metric: str | None
) -> dict[str, Any]:
    walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    reference = None
    for _ in range(repeats):
        for name, tuning in VARIANTS.items():
            wall, result = tune(model, calib, evaluation, trials, metric, **tuning)
            print(f"  {name}: {wall:.1f} s, {len(result.trials)} trials", flush=True)
            walls[name].append(wall)
            same = [(t.fingerprint, t.status) for t in result.trials]
            reference = reference or same
            if same != reference:
                sys.exit(f"{name} ran other trials than serial: the executors disagree")
    best = {name: min(values) for name, values in walls.items()}
    return {
        "trials": trials,
        "wall_s": best,
        "speedup_vs_serial": {name: best["serial"] / wall for name, wall in best.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    rec = recognizer()
    calib = lpq.ArrayLoader(crops(16, seed=1), batch_size=8)
    evaluation = lpq.ArrayLoader(crops(32, seed=2), batch_size=8)
    real = measure(str(rec), calib, evaluation, args.trials, args.repeats, "cosine")
    print(f"PP-OCRv4 rec: {real}", flush=True)

    example = lpq.get_plugin_manager().example("digits")
    tiny = measure(
        str(example.model),
        lpq.load_npz(example.calib),
        lpq.load_npz(example.eval),
        args.trials,
        args.repeats,
        None,
    )
    per_trial_s = real["wall_s"]["serial"] / args.trials
    overhead = {
        name: (tiny["wall_s"][name] - tiny["wall_s"]["serial"]) / args.trials for name in VARIANTS
    }
    report = {
        "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
        "ppocr_v4_rec": real,
        "digits_overhead": tiny,
        "serial_seconds_per_trial_rec": per_trial_s,
        "overhead_seconds_per_trial": overhead,
        "overhead_fraction_of_rec_trial": {n: o / per_trial_s for n, o in overhead.items()},
    }
    print(
        f"PP-OCRv4 recognizer, {args.trials} trials, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'executor':<12} {'wall s':>8} {'vs serial':>10} {'overhead/trial s':>17}"
        f" {'% of a rec trial':>17}"
    )
    for name in VARIANTS:
        print(
            f"{name:<12} {real['wall_s'][name]:8.1f} {real['speedup_vs_serial'][name]:9.2f}x"
            f" {overhead[name]:17.3f} {100 * overhead[name] / per_trial_s:16.1f}%"
        )
    out = Path(__file__).parent / "results" / "parallel.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
