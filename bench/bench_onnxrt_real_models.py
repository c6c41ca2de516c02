"""lpq int8 vs ONNX Runtime's own tool on real, published ONNX models.

The synthetic nets of bench_onnxrt.py show the kernels' ceiling; this script checks that
the same holds on models people ship. It uses the PP-OCRv4 text detector, recognizer and
direction classifier inside the `rapidocr-onnxruntime` wheel (only its model files are
read: install it with `pip install --no-deps rapidocr-onnxruntime`). Inputs are crops of
scikit-learn's two bundled photos with random words drawn on them in Pillow's built-in
font (so `pillow` is needed), normalised as PP-OCR expects; 16 crops calibrate, 16
others are measured.

For each model: fp32, lpq's default int8 (`lpq.quantize`), and ORT `quantize_static`
with U8S8 per-channel QDQ (the fast variant of ORT's tool) — latency at batch 1
(interleaved, median), size, and cosine similarity and relative L2 error of all outputs
against fp32.

    .venv/bin/python bench/bench_onnxrt_real_models.py

Prints a table and writes bench/results/onnxrt_real_models.json.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

import lpq

MODELS = {
    "ppocr-v4-det": ("ch_PP-OCRv4_det_infer.onnx", (3, 320, 320)),
    "ppocr-v4-rec": ("ch_PP-OCRv4_rec_infer.onnx", (3, 48, 320)),
    "ppocr-cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (3, 48, 192)),
}


def model_files() -> dict[str, Path]:
    try:
        dist = metadata.distribution("rapidocr-onnxruntime")
    except metadata.PackageNotFoundError:
        sys.exit("install the models first: pip install --no-deps rapidocr-onnxruntime")
    found = {Path(str(f)).name: Path(str(dist.locate_file(f))) for f in dist.files or []}
    return {name: found[file] for name, (file, _) in MODELS.items() if file in found}


WORDS = (
    "invoice",
    "total",
    "2026",
    "lpq",
    "quantize",
    "ONNX",
    "runtime",
    "int8",
    "accuracy",
    "model",
    "fast",
    "tuning",
    "latency",
    "Nov",
    "42.50",
    "receipt",
)


def crops(shape: tuple[int, int, int], count: int, seed: int) -> np.ndarray:
    """``count`` crops of the bundled photos with words drawn on them (what an OCR model
    sees), resized to ``shape`` (C, H, W) and normalised as PP-OCR expects."""
    from PIL import Image, ImageDraw, ImageFont
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = load_sample_images().images
    _, height, width = shape
    out = []
    for _ in range(count):
        photo = photos[rng.integers(len(photos))]
        h = int(rng.integers(height, photo.shape[0] + 1))
        w = min(photo.shape[1], max(width, int(h * width / height)))
        top = int(rng.integers(0, photo.shape[0] - h + 1))
        left = int(rng.integers(0, photo.shape[1] - w + 1))
        image = Image.fromarray(photo[top : top + h, left : left + w]).resize((width, height))
        draw = ImageDraw.Draw(image)
        lines = 1 if height <= 64 else 4
        for line in range(lines):
            words = " ".join(rng.choice(WORDS, size=3))
            size = int(height * 0.6) if lines == 1 else int(rng.integers(18, 32))
            y = (height - size) // 2 if lines == 1 else int(line * height / lines + 8)
            colour = (255, 255, 255) if rng.random() < 0.5 else (0, 0, 0)
            draw.text((8, y), words, fill=colour, font=ImageFont.load_default(size=size))
        out.append((np.asarray(image, np.float32) / 255.0 - 0.5) / 0.5)
    return np.stack(out).transpose(0, 3, 1, 2).astype(np.float32)


def ort_u8s8(model: Path, calib: np.ndarray, target: Path) -> Path:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"x": calib[i : i + 1]} for i in range(len(calib))])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    quantize_static(
        str(model),
        str(target),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return target


def session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def flat(outputs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([o.reshape(-1) for o in outputs]).astype(np.float64)


def relative_l2(reference: np.ndarray, other: np.ndarray) -> float:
    return float(np.linalg.norm(other - reference) / (np.linalg.norm(reference) + 1e-30))


def bench_model(
    name: str, path: Path, shape: tuple[int, int, int], folder: Path, repeats: int
) -> list[dict[str, Any]]:
    calib, evaluation = crops(shape, 16, seed=1), crops(shape, 16, seed=2)
    variants = {"fp32": path}
    start = time.perf_counter()
    quantized = lpq.quantize(str(path), calib_dataloader=lpq.ArrayLoader(calib, batch_size=1))
    variants["lpq int8"] = quantized.save(folder / f"{name}-lpq.onnx")
    lpq_seconds = time.perf_counter() - start
    variants["ort u8s8"] = ort_u8s8(path, calib, folder / f"{name}-ort.onnx")
    sessions = {label: session(p) for label, p in variants.items()}
    outputs = {
        label: [s.run(None, {"x": x[None]})[0] for x in evaluation] for label, s in sessions.items()
    }
    timings: dict[str, list[float]] = {label: [] for label in sessions}
    for _ in range(repeats):  # interleaved, so drift hits every variant alike
        for label, s in sessions.items():
            for x in evaluation[:4]:
                t = time.perf_counter()
                s.run(None, {"x": x[None]})
                timings[label].append(time.perf_counter() - t)
    fp32_ms = statistics.median(timings["fp32"]) * 1e3
    # Over all outputs at once: a per-sample cosine is undefined for near-zero outputs
    # (a detector's probability map on a photo without text).
    reference = flat(outputs["fp32"])
    rows = []
    for label, p in variants.items():
        ms = statistics.median(timings[label]) * 1e3
        rows.append(
            {
                "model": name,
                "variant": label,
                "ms": round(ms, 3),
                "speedup": round(fp32_ms / ms, 2),
                "size_mb": round(Path(p).stat().st_size / 1e6, 2),
                "cosine_vs_fp32": round(cosine(reference, flat(outputs[label])), 4),
                "rel_l2_vs_fp32": round(relative_l2(reference, flat(outputs[label])), 4),
            }
        )
    print(
        f"[{name}] lpq quantized in {lpq_seconds:.1f} s "
        f"({len(quantized.tune_cfg.quantized_ops())} ops int8)",
        flush=True,
    )
    return rows


def main() -> None:
    repeats = 5 if "--quick" in sys.argv else 15
    files = model_files()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in files.items():
            rows += bench_model(name, path, MODELS[name][1], Path(tmp), repeats)
    header = ["model", "variant", "ms", "speedup", "size_mb", "cosine_vs_fp32", "rel_l2_vs_fp32"]
    print("\n" + " | ".join(header) + "\n" + " | ".join("---" for _ in header))
    for row in rows:
        print(" | ".join(str(row[h]) for h in header))
    out = Path(__file__).parent / "results" / "onnxrt_real_models.json"
    lpq.write_json(out, {"batch": 1, "threads": 1, "rows": rows})
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
