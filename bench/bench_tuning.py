"""Trials and wall time each strategy needs to meet a 1% relative accuracy goal.

Models: the built-in digits example (lpq-onnxrt) and two outlier-heavy MLPs where two
layers carry nearly all the quantization error (see outlier_mlp.py): in the wide one a
clipping calibration absorbs the outliers; in the narrow one only fallback helps. For every
strategy: trials until the goal is met, wall time, final accuracy and the latency
speedup of the chosen model over fp32 (measured by the adaptor during tuning).

    .venv/bin/python bench/bench_tuning.py [--strategies auto,basic,mse,conservative]

Prints a table and writes bench/results/tuning.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import lpq

sys.path.insert(0, str(Path(__file__).parent))
import outlier_mlp


def models(folder: Path) -> dict[str, dict[str, object]]:
    example = lpq.get_plugin_manager().example("digits")
    with np.load(example.calib) as c, np.load(example.eval) as e:
        calib = c[c.files[0]]
        eval_x = e[next(f for f in e.files if f != "labels")]
        eval_y = e["labels"]
    digits = {"model": str(example.model), "calib": calib, "eval": (eval_x, eval_y)}
    found = {"digits-cnn": digits}
    variants = {
        # Two outlier units in a wide MLP: a clipping calibration can absorb them.
        "outlier-mlp-256x8": {"hidden": 256, "layers": 8, "outlier_layers": (2, 5)},
        # Narrow layers: the outliers wreck two producer/consumer pairs; only fallback helps.
        "outlier-mlp-64x6": {"hidden": 64, "layers": 6, "outlier_layers": (1, 3)},
    }
    for name, shape in variants.items():
        path = folder / f"{name}.onnx"
        data = outlier_mlp.build(path, **shape)  # type: ignore[arg-type]
        found[name] = {
            "model": str(path),
            "calib": data["calib"],
            "eval": (data["eval_x"], data["eval_y"]),
        }
    return found


def run(model: dict[str, object], strategy: str, workspace: Path) -> dict[str, object]:
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(strategy=strategy, max_trials=60),
    )
    start = time.perf_counter()
    x, y = model["eval"]  # type: ignore[misc]
    result = lpq.fit(
        model["model"],
        conf,
        lpq.ArrayLoader(model["calib"], batch_size=32),
        eval_dataloader=lpq.ArrayLoader(x, y, batch_size=64),
        eval_metric="top1",
        workspace=workspace,
    )
    wall = time.perf_counter() - start
    summary = result.summary()
    return {
        "strategy": strategy,
        "goal_met": result.goal_met,
        "trials": len(result.trials),
        "wall_s": round(wall, 2),
        "fp32_accuracy": round(summary["baseline_accuracy"], 4),
        "final_accuracy": round(summary["final_accuracy"], 4),
        "quantized_ops": summary["quantized_ops"],
        "fallback_ops": summary["fallback_ops"],
        "speedup": round(summary["latency_speedup"], 2) if summary["latency_speedup"] else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default="auto,basic,mse,conservative")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "tuning.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for model_name, model in models(folder).items():
            for strategy in args.strategies.split(","):
                row = {"model": model_name, **run(model, strategy, folder / model_name / strategy)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    header = [
        "model",
        "strategy",
        "goal_met",
        "trials",
        "wall_s",
        "fp32_accuracy",
        "final_accuracy",
        "quantized_ops",
        "fallback_ops",
        "speedup",
    ]
    print()
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for row in rows:
        print(" | ".join(str(row[h]) for h in header))
    lpq.write_json(args.out, {"goal": "1% relative top-1 loss", "rows": rows})
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
