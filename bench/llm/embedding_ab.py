"""The token embedding as GatherBlockQuantized on SmolLM2: what int8 and int4 cost.

    .venv/bin/python bench/llm/embedding_ab.py [--algorithm rtn] [--rounds 3]

Builds lpq's int4 weight-only model (``onnx_lpq``'s recipe: int4 sym block 32,
``lm_head=auto``, the bench's calibration windows) four times, differing only in the
``embedding`` option (``fp32``, ``int8``, ``int4``, ``auto``), then measures each as
``run.py`` does (``measure.py``: perplexity, top-1 agreement and KL against the fp32
model on the 8 evaluation windows; decode ms/token after a 16-token prompt, one thread,
the variants interleaved round by round, median). Prints a table and writes
``bench/llm/embedding_ab.json``. Builds go to ``<cache>/embedding-ab/`` (kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import measure  # noqa: E402
import model as llm_model  # noqa: E402
import onnx_lpq  # noqa: E402
from run import EVAL_WINDOWS, PROMPT, WINDOW, fmt, kv_layout  # noqa: E402

CHOICES = ("fp32", "int8", "int4", "auto")


def build(cache: Path, choice: str, algorithm: str) -> dict[str, Any]:
    """One build in this process: the path, the wall time and the report's decision."""
    import onnx

    from lpq_onnxrt.passes.weight_only import read_report

    out = cache / "embedding-ab" / f"{algorithm}-{choice}"
    out.mkdir(parents=True, exist_ok=True)
    calib = np.load(cache / "calib.npy")
    ctx = llm_model.BuildContext(cache, out, calib, *kv_layout(cache))
    start = time.perf_counter()
    path = onnx_lpq._build(ctx, algorithm, options={"embedding": choice})
    wall = time.perf_counter() - start
    report = read_report(onnx.load(str(path), load_external_data=False)) or {}
    return {"path": str(path), "quant_s": round(wall, 1), "embedding": report.get("embedding")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=llm_model.CACHE)
    parser.add_argument("--algorithm", default="rtn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=HERE / "embedding_ab.json")
    args = parser.parse_args()
    kv = kv_layout(args.cache)
    rows: dict[str, dict[str, Any]] = {"fp32 model": {"path": str(llm_model.fp32_onnx(args.cache))}}
    for choice in CHOICES:
        rows[f"{args.algorithm} embedding={choice}"] = build(args.cache, choice, args.algorithm)
    ids = llm_model.token_ids(args.cache)
    windows = llm_model.windows(ids, EVAL_WINDOWS, WINDOW)
    models: dict[str, Any] = {}
    reference = None
    for name, row in rows.items():
        models[name] = measure.OnnxDecoder(Path(row["path"]), *kv)
        acc = measure.accuracy(models[name], windows, reference)
        reference = acc.logits if reference is None else reference
        row.update(
            perplexity=acc.perplexity,
            top1_agreement=acc.top1_agreement,
            mean_kl=acc.mean_kl,
            size_mb=measure.size_mb(Path(row["path"])),
        )
    prompt = ids[:PROMPT]
    timings: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, decoder in models.items():
            timings[name].append(decoder.timed_decode(prompt, args.new_tokens)[1])
    for name, samples in timings.items():
        rows[name]["decode_ms"] = statistics.median(samples)
    print(f"load {os.getloadavg()}; decode after {PROMPT} tokens, {args.new_tokens} tokens")
    print("| variant | ppl | top-1 agr | KL | decode ms/tok | size MB | quant s | embedding kept |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        kept = (r.get("embedding") or {}).get("kept", "-")
        print(
            f"| {name} | {r['perplexity']:.2f} | {fmt(r['top1_agreement'], '.3f')} "
            f"| {fmt(r['mean_kl'], '.4f')} | {r['decode_ms']:.1f} | {r['size_mb']:.0f} "
            f"| {r.get('quant_s', '-')} | {kept} |"
        )
    args.json.write_text(json.dumps({"load": os.getloadavg(), "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
