"""Parallel and distributed tuning: wall time of N accuracy trials with 1 and 2 workers,
the one-time per-run preparation apart from the trials, and Ray's per-trial overhead.

Model: the PP-OCRv4 text recognizer shipped in the `rapidocr-onnxruntime` wheel (a real,
published model; installed here with `--no-deps` if missing — only its .onnx file is
read). Inputs: crops of scikit-learn's bundled photos at 3x48x320, normalised as PP-OCR
expects. Accuracy is the cosine similarity of the quantized model's outputs to fp32's.

Every run tunes the same N trials: the `random` strategy with a fixed seed and an
unreachable goal, so no run stops early and every trial is an *accuracy trial*
(quantize, read back, evaluate: a candidate that misses the goal gets no latency pass).
Weights stay per-channel (mixing per-tensor and per-channel weights in one model fails
in ONNX Runtime's quantizer, and failed trials would be cheap, not representative) and
the latency-aware recipe is off (it times the model inside `quantize`).

Variants, one after another in this process: serial; a local process pool with 2
workers; Ray with 2 workers (a local Ray on 127.0.0.1). Each fit is split into phases:

* **setup**: capability query, fp32 baseline (accuracy and latency), executor start;
* **prepare**: the driver's warm-up (prepared model, calibration statistics for every
  calibration algorithm the space uses) before any worker exists;
* **trials**: the N trials, the phase workers share;
* **finish**: timing the answer (the most accurate candidate) and the final fp32-vs-
  chosen latency, interleaved.

Ray's per-trial overhead against the process pool is (Ray trials phase - pool trials
phase) / N, on the recognizer and on the tiny digits model (trials of milliseconds,
where only overhead is left), as a share of a serial recognizer trial.

    .venv/bin/python bench/bench_parallel.py [--trials 16] [--repeats 1] [--unpinned]

``--unpinned`` adds a process pool whose workers are not pinned to their share of the
cores (``executor_options={"pin": False}``), to see what pinning does on this machine.

Prints a table and writes bench/results/parallel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


VARIANTS = {
    "serial": {"workers": 1, "executor": "serial"},
    "process x2": {"workers": 2, "executor": "process"},
    "ray x2": {"workers": 2, "executor": "ray"},
}


#: The recognizer's weights stay per-channel (see the module docstring).
PER_CHANNEL = {t: {"weight": {"granularity": ["per_channel"]}} for t in ("Conv", "MatMul")}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tune(
    model: str, calib: Any, evaluation: Any, trials: int, metric: str | None, **tuning: Any
) -> dict[str, Any]:
    """One fit; its wall time split into phases (see the module docstring)."""
    conf = lpq.PostTrainingQuantConfig(
        latency_aware=False,
        op_type_dict=PER_CHANNEL if metric == "cosine" else {},
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=1e-9),
        tuning_criterion=lpq.TuningCriterion(
            strategy="random", max_trials=trials, exit_policy="best", seed=11, **tuning
        ),
    )
    # Driver CPU seconds from the first finished trial to the last: how many cores a
    # serial trial keeps busy (its work in worker processes is not counted).
    marks: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as workspace:
        began = time.time()
        result = lpq.fit(
            model,
            conf,
            calib,
            eval_dataloader=evaluation,
            eval_metric=metric,
            workspace=workspace,
            on_trial=lambda _: marks.append((time.perf_counter(), cpu_seconds())),
        )
        total = time.time() - began
        timing = json.loads(result.history_path.read_text())["timing"]
    setup = timing["began"] - began
    cores = (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0]) if len(marks) > 2 else 0
    return {
        "total_s": total,
        "setup_s": setup,
        "prepare_s": timing["prepare_s"],
        "trials_s": timing["trials_s"],
        "finish_s": total - setup - timing["prepare_s"] - timing["trials_s"],
        "driver_cores_busy_in_trials": cores,
        "trials": [(t.fingerprint, t.status) for t in result.trials],
        "in_workers": sum(1 for t in result.trials if t.worker),
    }


def measure(
    model: str, calib: Any, evaluation: Any, trials: int, repeats: int, metric: str | None
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    reference = None
    for _ in range(repeats):
        for name, tuning in VARIANTS.items():
            run = tune(model, calib, evaluation, trials, metric, **tuning)
            print(
                f"  {name}: {run['total_s']:.1f} s (setup {run['setup_s']:.1f}, prepare "
                f"{run['prepare_s']:.1f}, trials {run['trials_s']:.1f}, finish "
                f"{run['finish_s']:.1f}), {len(run['trials'])} trials, "
                f"{run['in_workers']} in workers",
                flush=True,
            )
            reference = reference or run["trials"]
            if run.pop("trials") != reference:
                sys.exit(f"{name} ran other trials than serial: the executors disagree")
            runs[name].append(run)
    best = {name: min(values, key=lambda r: r["trials_s"]) for name, values in runs.items()}
    serial = best["serial"]
    return {
        "trials": trials,
        "runs": best,
        "speedup_trials_phase": {n: serial["trials_s"] / r["trials_s"] for n, r in best.items()},
        "speedup_total": {n: serial["total_s"] / r["total_s"] for n, r in best.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--unpinned", action="store_true", help="also an unpinned pool")
    args = parser.parse_args()
    if args.unpinned:
        VARIANTS["process x2 unpinned"] = {
            "workers": 2,
            "executor": "process",
            "executor_options": {"pin": False},
        }
    start = time.perf_counter()
    load_before = os.getloadavg()

    rec = recognizer()
    # Latency passes run on the calibration batches: small ones keep them short.
    calib = lpq.ArrayLoader(crops(16, seed=1), batch_size=2)
    evaluation = lpq.ArrayLoader(crops(32, seed=2), batch_size=8)
    print(f"PP-OCRv4 rec, {args.trials} trials:", flush=True)
    real = measure(str(rec), calib, evaluation, args.trials, args.repeats, "cosine")

    example = lpq.get_plugin_manager().example("digits")
    print(f"digits, {args.trials} trials (overhead):", flush=True)
    tiny = measure(
        str(example.model),
        lpq.load_npz(example.calib),
        lpq.load_npz(example.eval),
        args.trials,
        args.repeats,
        None,
    )
    n = args.trials
    per_trial_s = real["runs"]["serial"]["trials_s"] / n
    ray_overhead = {
        label: (runs["runs"]["ray x2"]["trials_s"] - runs["runs"]["process x2"]["trials_s"]) / n
        for label, runs in (("rec", real), ("digits", tiny))
    }
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
        },
        "ppocr_v4_rec": real,
        "digits": tiny,
        "serial_rec_trial_s": per_trial_s,
        "ray_overhead_per_trial_s": ray_overhead,
        "ray_overhead_share_of_rec_trial": {k: v / per_trial_s for k, v in ray_overhead.items()},
        "bench_wall_s": time.perf_counter() - start,
    }
    print(
        f"\nPP-OCRv4 recognizer, {n} accuracy trials, {os.cpu_count()} cores, load "
        f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    head = ("executor", "setup", "prepare", "trials", "finish", "total", "x trials", "x total")
    print("{:<20}{:>8}{:>9}{:>8}{:>8}{:>8}{:>10}{:>9}".format(*head))
    for name in VARIANTS:
        run = real["runs"][name]
        print(
            f"{name:<20}{run['setup_s']:8.1f}{run['prepare_s']:9.1f}{run['trials_s']:8.1f}"
            f"{run['finish_s']:8.1f}{run['total_s']:8.1f}"
            f"{real['speedup_trials_phase'][name]:9.2f}x{real['speedup_total'][name]:8.2f}x"
        )
    busy = real["runs"]["serial"]["driver_cores_busy_in_trials"]
    print(f"a serial trial keeps {busy:.2f} cores busy on average (seconds of CPU / wall)")
    for label, seconds in ray_overhead.items():
        print(
            f"Ray overhead per trial vs the process pool ({label}): {seconds:.3f} s = "
            f"{100 * seconds / per_trial_s:.1f}% of a serial rec trial ({per_trial_s:.2f} s)"
        )
    print(f"bench wall time {report['bench_wall_s']:.0f} s")
    out = Path(__file__).parent / "results" / "parallel.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
