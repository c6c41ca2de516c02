"""MediaPipe's detectors quantized by lpq and by Google's ai-edge-quantizer, judged by the
detections they keep, their speed, and what quantizing them cost.

Models: the float ``.tflite`` files the ``mediapipe`` 0.10.21 wheel ships (found as
``bench_tf.py`` finds them): BlazeFace (``face_detection_short_range``, 128x128) and the
pose detector (``pose_detection``, 224x224). Both read RGB in [-1, 1], the range
MediaPipe's own graphs feed them (``output_tensor_float_range`` in the wheel's
ImageToTensorCalculator options). ``palm_detection_lite`` is left out: these pictures
hold no hands, so its fp32 model finds almost nothing to keep.

Pictures: ``bench/real_models``' ``people_images`` (scikit-image photos with 0-3 people
pasted on them; needs ``pip install scikit-image`` in this environment): 48 to calibrate
(seed 1), 100 held out (seed 3).

Variants, each quantization in its own process under ``/usr/bin/time`` (CPU seconds and
peak memory, whole process):

* ``lpq``: ``lpq quantize MODEL --calib ... --eval ... --batch-size 1``, the defaults,
  from an empty latency cache (``LPQ_CACHE_DIR`` a fresh folder);
* ``lpq-heads-int8``: the same with ``--option float_output_ops=false`` (lpq-tf's
  output-head rule off: the ops that compute the outputs in int8);
* ``aeq-static``: ai-edge-quantizer's static int8 recipe (``add_static_config('.*',
  ALL_SUPPORTED, 8, 8)``, its own ``calibrate`` on the same pictures), as its docs run it;
* ``aeq-dynamic``: its dynamic-range recipe (int8 weights, float activations).

ai-edge-quantizer cannot calibrate the files as shipped (they have no signature, and the
pose detector's weights are sparse float16), so both of its variants get the float model
as lpq-tf prepares it (a serving signature added, weights made dense float32; the same
outputs, bit for bit): the best it can be given. ``int8_ops`` is read from each written
model (lpq-tf's precision rule over every op but QUANTIZE / DEQUANTIZE), not from any plan.

Fidelity: detection F1 over anchors against the fp32 model at score thresholds 0.25, 0.5
and 0.75 (an anchor whose score passes the threshold is a detection; matched with the
same fp32 anchor; MediaPipe itself thresholds at 0.5 for faces and poses). Speed: every
variant and the float model timed interleaved in LiteRT with one thread
(``lpq.latency.interleaved``), as fp32 time / variant time.

    .venv/bin/python bench/bench_mediapipe.py [--models face_detection_short_range,pose_detection]

Prints a table with the CPU's int8 features and writes ``bench/results/mediapipe.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "real_models"))
os.environ["LPQ_TF_THREADS"] = "1"

from bench_quantize_cost import fidelity_of, timed  # noqa: E402  (bench/, just put on the path)

#: name -> (input side, input range)
MODELS = {
    "face_detection_short_range": (128, (-1.0, 1.0)),
    "pose_detection": (224, (-1.0, 1.0)),
}
THRESHOLDS = (0.25, 0.5, 0.75)
VARIANTS = ("lpq", "lpq-heads-int8", "aeq-static", "aeq-dynamic")

AEQ_SCRIPT = r"""
import sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter
from ai_edge_quantizer import qtyping, quantizer, recipe
model, calib, out, kind = sys.argv[1:5]
tool = quantizer.Quantizer(model)
if kind == "static":
    tool.add_static_config(".*", qtyping.TFLOperationName.ALL_SUPPORTED, 8, 8)
    signature = next(iter(Interpreter(model_path=model).get_signature_list()))
    runner = Interpreter(model_path=model).get_signature_runner(signature)
    name = next(iter(runner.get_input_details()))
    data = np.load(calib)
    samples = [{name: x[None]} for x in data[data.files[0]]]
    ranges = tool.calibrate({signature: samples})
    result = tool.quantize(ranges)
else:
    tool.load_quantization_recipe(recipe.dynamic_wi8_afp32())
    result = tool.quantize()
open(out, "wb").write(bytes(result.quantized_model))
"""


def pictures(side: int, low: float, high: float, count: int, seed: int) -> np.ndarray:
    from models import people_images
    from PIL import Image

    images = people_images(count, seed, size=320)
    resized = np.stack([np.asarray(Image.fromarray(i).resize((side, side))) for i in images])
    return (resized.astype(np.float32) / 255.0 * (high - low) + low).astype(np.float32)


def quantize(
    variant: str, model: Path, prepared: Path, calib: Path, test: Path, out: Path
) -> dict[str, Any]:
    log = out.with_suffix(".log")
    if variant.startswith("aeq-"):
        kind = variant.split("-", 1)[1]
        command = [sys.executable, "-c", AEQ_SCRIPT, str(prepared), str(calib), str(out), kind]
    else:
        command = [str(Path(sys.executable).with_name("lpq")), "quantize", str(model)]
        command += ["--calib", str(calib), "--eval", str(test), "--batch-size", "1"]
        command += ["--out", str(out)]
        if variant == "lpq-heads-int8":
            command += ["--option", "float_output_ops=false"]
    # from an empty lpq cache: the first quantization of the model on this machine
    return timed(command, {**os.environ, "LPQ_CACHE_DIR": str(out.with_suffix(".cache"))}, log)


def scores(content: bytes, data: np.ndarray) -> np.ndarray:
    """The score output (width 1) of every picture, as float."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content, num_threads=1)
    interpreter.allocate_tensors()
    feed = interpreter.get_input_details()[0]
    outputs = interpreter.get_output_details()
    score = next(d for d in outputs if d["shape"][-1] == 1)
    found = []
    for x in data:
        value = x[None]
        if feed["dtype"] != np.float32:  # an int8 input: quantize as the model says
            scale, zero = feed["quantization"]
            value = np.clip(np.round(value / scale + zero), -128, 127).astype(feed["dtype"])
        interpreter.set_tensor(feed["index"], value)
        interpreter.invoke()
        raw = interpreter.get_tensor(score["index"]).astype(np.float32).reshape(-1)
        if score["dtype"] != np.float32:
            scale, zero = score["quantization"]
            raw = (raw - zero) * scale
        found.append(raw)
    return np.stack(found)


def int8_ops(content: bytes) -> tuple[int, int]:
    """(ops running in int8, all ops but QUANTIZE / DEQUANTIZE), read from the file."""
    from lpq_tf.graph import read
    from lpq_tf.precision import op_precision

    parsed = read(content)
    ops = parsed.model_ops()
    return sum(op_precision(parsed, op) == "int8" for op in ops), len(ops)


def anchor_f1(reference: np.ndarray, logits: np.ndarray) -> dict[str, Any]:
    rows = {}
    for threshold in THRESHOLDS:
        edge = float(np.log(threshold / (1 - threshold)))
        want, got = reference > edge, logits > edge
        total = int(want.sum() + got.sum())
        rows[str(threshold)] = {
            "f1": round(2 * int((want & got).sum()) / total, 3) if total else None,
            "fp32": int(want.sum()),
            "quantized": int(got.sum()),
        }
    return rows


def speeds(model: Path, written: dict[str, Path], sample: np.ndarray) -> dict[str, Any]:
    from ai_edge_litert.interpreter import Interpreter

    from lpq.latency import interleaved

    runs = {}
    for label, path in {"fp32": model, **written}.items():
        interpreter = Interpreter(model_path=str(path), num_threads=1)
        interpreter.allocate_tensors()
        feed = interpreter.get_input_details()[0]
        value = sample[None]
        if feed["dtype"] != np.float32:
            value = np.zeros(feed["shape"], feed["dtype"])
        interpreter.set_tensor(feed["index"], value)
        runs[label] = interpreter.invoke
    timing = interleaved(runs, budget_s=3.0, min_rounds=30)
    return {
        label: {
            "ms": round(timing.ms(label), 4),
            "speedup": round(1.0 / timing.ratio(label, "fp32"), 3),
            "noise": round(timing.noise(label, "fp32"), 3),
        }
        for label in written
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mediapipe.json")
    args = parser.parse_args()
    try:
        import skimage  # noqa: F401
    except ImportError:
        sys.exit("bench_mediapipe needs scikit-image for its pictures: pip install scikit-image")
    from bench_tf import mediapipe_models

    import lpq

    found = mediapipe_models()
    features = lpq.cpu_features()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lpq-mediapipe-") as work:
        folder = Path(work)
        for name in args.models.split(","):
            side, (low, high) = MODELS[name]
            model = found[name]
            calib = folder / f"{name}-calib.npz"
            test = folder / f"{name}-test.npz"
            held_out = pictures(side, low, high, 100, seed=3)
            from lpq_tf.model_io import prepare
            from lpq_tf.runtime import Runner

            prepared = folder / f"{name}-prepared.tflite"
            prepared.write_bytes(prepare(str(model)).float_tflite)
            key = Runner(model.read_bytes()).specs[0].name  # the .npz names the model's input
            np.savez(calib, **{key: pictures(side, low, high, 48, seed=1)})
            np.savez(test, **{key: held_out})
            reference = scores(model.read_bytes(), held_out)
            written = {}
            for variant in VARIANTS:
                out = folder / f"{name}-{variant}.tflite"
                cost = quantize(variant, model, prepared, calib, test, out)
                row = {"model": name, "variant": variant, **cost}
                if row["rc"] == 0 and out.exists():
                    row["int8_ops"], row["ops"] = int8_ops(out.read_bytes())
                    written[variant] = out
                    row["anchor_f1"] = anchor_f1(reference, scores(out.read_bytes(), held_out))
                    row["size_mb"] = round(out.stat().st_size / 1e6, 2)
                    row["lpq_fidelity"] = fidelity_of(row["log"])
                rows.append(row)
                print(f"  {name} {variant}: rc {row['rc']}, {row['cpu_s']} CPU s", flush=True)
            for variant, speed in speeds(model, written, held_out[0]).items():
                next(r for r in rows if r["model"] == name and r["variant"] == variant).update(
                    speed
                )
    header = f"{features.describe()}, 1 thread, load {load_before[0]:.1f}"
    print(f"\n{header}")
    print(
        "| model | variant | int8 ops | F1 @0.25 | F1 @0.5 | F1 @0.75 | fp32 speed x "
        "| CPU s | peak MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "anchor_f1" not in r:
            print(f"| {r['model']} | {r['variant']} | failed (rc {r['rc']}, {r['log']}) |")
            continue
        f1 = " | ".join(str(r["anchor_f1"][str(t)]["f1"]) for t in THRESHOLDS)
        print(
            f"| {r['model']} | {r['variant']} | {r['int8_ops']}/{r['ops']} | {f1} | "
            f"{r.get('speedup', '-')} | "
            f"{r['cpu_s']} | {r['peak_rss_mb']} |"
        )
    lpq.write_json(
        args.out,
        {
            "cpu_features": features.as_dict(),
            "cores": os.cpu_count(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "ai_edge_litert": lpq.installed_version("ai-edge-litert"),
            "ai_edge_quantizer": lpq.installed_version("ai-edge-quantizer"),
            "rows": rows,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
