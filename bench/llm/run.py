"""SmolLM2-135M weight-only bench: fp32, the peers and lpq's rows on one table.

    python bench/llm/run.py [--quick] [--variants a,b] [--cache DIR] [--reuse]

Installs its own extras (model and text wheels into this venv; onnxruntime-genai and
NNCF into an overlay venv under the cache), builds every variant in a child process
(wall time and that child's peak RSS are the quantization cost), then measures all of
them in this process: perplexity / top-1 agreement / KL on the same windows, and decode
ms/token timed round-robin over variants (median of rounds) on one thread. Prints a
table, marks the variants dominated on the (perplexity, decode ms/token) plane and
writes ``bench/llm/results.json``. lpq's rows come from ``onnx_lpq.py`` and
``torch_weight_only.py`` beside this file when they expose ``variants()`` (README).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
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
import peers  # noqa: E402

LPQ_MODULES = ("onnx_lpq", "torch_weight_only")
EVAL_WINDOWS, CALIB_WINDOWS, WINDOW, PROMPT = 8, 8, 256, 16


def registry() -> tuple[dict[str, Any], dict[str, bool], list[str]]:
    """name -> build fn, name -> needs the extras venv, and notes on missing lpq modules."""
    builds = {p.name: p.build for p in peers.PEERS.values()}
    extras = {p.name: p.extras for p in peers.PEERS.values()}
    notes = []
    for module in LPQ_MODULES:
        try:
            found = importlib.import_module(module)
        except Exception as exc:  # some quantized modules do not pickle
            notes.append(f"{module}: not loaded ({type(exc).__name__}: {exc})")
            continue
        if not hasattr(found, "variants"):
            notes.append(f"{module}: has no variants(); skipped")
            continue
        for name, build in found.variants():
            builds[name], extras[name] = build, False
    return builds, extras, notes


def child_build(name: str, cache: Path, out_dir: Path) -> None:
    """Child-process entry: build one variant and record what it produced."""
    builds, _, _ = registry()
    calib = np.load(cache / "calib.npy")
    kv_heads, head_dim = kv_layout(cache)
    ctx = llm_model.BuildContext(cache, out_dir, calib, kv_heads, head_dim)
    made = builds[name](ctx)
    if isinstance(made, (str, Path)):
        record = {"kind": "onnx", "path": str(made)}
    else:
        import torch

        path = out_dir / "model.pt"
        try:
            torch.save(without_repr_hooks(made), path)
            record = {"kind": "torch", "path": str(path)}
        except Exception as exc:  # some quantized modules do not pickle
            path.unlink(missing_ok=True)  # the driver rebuilds it in-process instead
            record = {"kind": "torch-rebuild", "path": str(out_dir), "why": str(exc)[:200]}
    (out_dir / "built.json").write_text(json.dumps(record))


def without_repr_hooks(module: Any) -> Any:
    """Drop the per-instance ``extra_repr`` that torchao's ``quantize_`` sets, in place.

    ``quantize_`` replaces ``module.extra_repr`` on each quantized Linear with a bound
    method over a ``functools.partial``; pickle needs the function's ``__name__``, which
    a partial lacks, so ``torch.save`` of the whole model fails. It only changes how the
    module prints: the class's own ``extra_repr`` takes over again.
    """
    for sub in module.modules():
        sub.__dict__.pop("extra_repr", None)
    return module


def kv_layout(cache: Path) -> tuple[int, int]:
    config = json.loads((llm_model.load_hf(cache) / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return int(config["num_key_value_heads"]), int(head_dim)


def build_all(
    names: list[str], extras: dict[str, bool], cache: Path, reuse: bool, timeout: int
) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        out = cache / "variants" / name
        cost = out / "cost.json"
        if reuse and cost.exists():
            rows[name] = json.loads(cost.read_text())
            print(f"[build] {name}: reused", flush=True)
            continue
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        python = llm_model.extras_python(cache) if extras[name] else sys.executable
        cmd = [
            "timeout",
            str(timeout),
            python,
            str(Path(__file__).resolve()),
            "--build",
            name,
            "--cache",
            str(cache),
            "--out",
            str(out),
        ]
        code, wall, peak, cpu = measure.run_measured(cmd, out / "build.log")
        row: dict[str, Any] = {
            "quant_wall_s": round(wall, 1),
            "quant_cpu_s": round(cpu, 1),
            "quant_peak_mb": round(peak),
        }
        if code == 0 and (out / "built.json").exists():
            row.update(json.loads((out / "built.json").read_text()))
        else:
            lines = (out / "build.log").read_text(errors="replace").strip().splitlines()
            why = (
                f"timed out after {timeout} s"
                if code == 124
                else (lines[-1] if lines else f"exit {code}")
            )
            row["error"] = f"build failed: {why[:300]}"
        cost.write_text(json.dumps(row))
        print(
            f"[build] {name}: {row.get('error', 'ok')} "
            f"({row['quant_wall_s']} s, {row['quant_peak_mb']} MB)",
            flush=True,
        )
        rows[name] = row
    return rows


def load(name: str, row: dict[str, Any], kv: tuple[int, int], cache: Path) -> Any:
    if row["kind"] == "onnx":
        return measure.OnnxDecoder(Path(row["path"]), *kv)
    import torch

    if row["kind"] == "torch-rebuild":  # did not pickle: build again here (cost from child)
        builds, _, _ = registry()
        ctx = llm_model.BuildContext(cache, Path(row["path"]), np.load(cache / "calib.npy"), *kv)
        row["kind"] = "torch"
        row["load_note"] = "built again in the driver (did not pickle); size not measured"
        return measure.TorchDecoder(builds[name](ctx))
    return measure.TorchDecoder(torch.load(row["path"], weights_only=False))


def mark_dominated(rows: dict[str, dict[str, Any]]) -> None:
    """A row is dominated if another is no worse in perplexity and decode ms, better in one."""
    pts = {
        n: (r["perplexity"], r["decode_ms"])
        for n, r in rows.items()
        if r.get("perplexity") is not None and r.get("decode_ms") is not None
    }
    for name, (p, t) in pts.items():
        better = [
            o for o, (q, u) in pts.items() if o != name and q <= p and u <= t and (q < p or u < t)
        ]
        if better:  # name the dominating row closest in perplexity
            rows[name]["dominated_by"] = min(better, key=lambda o: abs(pts[o][0] - p))


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: dict[str, dict[str, Any]]) -> str:
    head = (
        "| variant | ppl | Δ% | top-1 agr | KL | decode ms/tok | speedup | prefill ms "
        "| size MB | quant s | peak MB | dominated / note |"
    )
    lines = [head, "|" + "---|" * 12]
    for name, r in rows.items():
        note = r.get("error") or (f"by {r['dominated_by']}" if r.get("dominated_by") else "")
        for extra in ("load_note", "decode_note"):
            if r.get(extra):
                note = (note + "; " if note else "") + r[extra]
        lines.append(
            f"| {name} | {fmt(r.get('perplexity'), '.2f')} | {fmt(r.get('ppl_delta_pct'), '+.1f')} "
            f"| {fmt(r.get('top1_agreement'), '.3f')} | {fmt(r.get('mean_kl'), '.3f')} "
            f"| {fmt(r.get('decode_ms'), '.1f')} | {fmt(r.get('speedup'), '.2f')} "
            f"| {fmt(r.get('prefill_ms'), '.0f')} | {fmt(r.get('size_mb'), '.0f')} "
            f"| {fmt(r.get('quant_wall_s'), '.0f')} | {fmt(r.get('quant_peak_mb'), '.0f')} "
            f"| {note} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="2 eval windows, 16 tokens, 3 rounds, a few peers"
    )
    parser.add_argument("--variants", help="comma-separated names (fp32 is always measured)")
    parser.add_argument("--cache", type=Path, default=llm_model.CACHE)
    parser.add_argument("--json", type=Path, default=HERE / "results.json")
    parser.add_argument(
        "--reuse", action="store_true", help="reuse variants built by an earlier run"
    )
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument("--build-timeout", type=int, default=1200)
    parser.add_argument("--list", action="store_true", help="print the variant names and exit")
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        child_build(args.build, args.cache, args.out)
        return
    builds, extras, notes = registry()
    if args.list:
        print("\n".join(["fp32", *builds]))
        return
    began = time.perf_counter()
    n_eval = 2 if args.quick else EVAL_WINDOWS
    rounds = args.rounds or (3 if args.quick else 5)
    new_tokens = args.new_tokens or (16 if args.quick else 32)
    if args.variants:
        names = [n for n in args.variants.split(",") if n and n != "fp32"]
        unknown = [n for n in names if n not in builds]
        if unknown:
            raise SystemExit(f"unknown variants {unknown}; see --list")
    elif args.quick:
        names = [n for n, p in peers.PEERS.items() if p.quick] + [
            n for n in builds if n not in peers.PEERS
        ]
    else:
        names = list(builds)

    import lpq

    llm_model.ensure_data_packages(args.cache)
    if any(extras[n] for n in names):
        llm_model.extras_python(args.cache)
    ids = llm_model.token_ids(args.cache)
    windows = llm_model.windows(ids, n_eval, WINDOW)
    calib = llm_model.windows(ids, CALIB_WINDOWS, WINDOW, start=4 * EVAL_WINDOWS * WINDOW)
    np.save(args.cache / "calib.npy", calib)
    kv = kv_layout(args.cache)
    fp32_path = llm_model.fp32_onnx(args.cache)
    cpu = lpq.cpu_features()
    print(
        f"CPU int8 flags: {cpu.describe()}; {len(names)} variants; notes: {notes or 'none'}",
        flush=True,
    )

    rows: dict[str, dict[str, Any]] = {"fp32": {"kind": "onnx", "path": str(fp32_path)}}
    rows.update(build_all(names, extras, args.cache, args.reuse, args.build_timeout))

    models: dict[str, Any] = {}
    reference: list[np.ndarray] | None = None
    for name, row in rows.items():
        if "error" in row:
            continue
        try:
            models[name] = load(name, row, kv, args.cache)
            acc = measure.accuracy(models[name], windows, reference)
        except Exception as exc:  # some quantized modules do not pickle
            row["error"] = f"measure failed: {type(exc).__name__}: {str(exc)[:300]}"
            models.pop(name, None)
            print(f"[accuracy] {name}: {row['error']}", flush=True)
            continue
        if reference is None:
            reference = acc.logits
        row.update(
            perplexity=acc.perplexity, top1_agreement=acc.top1_agreement, mean_kl=acc.mean_kl
        )
        path = Path(row["path"])
        if row["kind"] == "onnx":
            row["size_mb"] = measure.size_mb(path)
        elif path.is_file():  # a rebuilt torch row has no file: size unknown
            row["size_mb"] = path.stat().st_size / 1e6
        print(
            f"[accuracy] {name}: ppl {acc.perplexity:.3f} agree {acc.top1_agreement:.3f}",
            flush=True,
        )

    prompt = ids[:PROMPT]
    tokens = {n: measure.decode_tokens_for(m, prompt, new_tokens) for n, m in models.items()}
    timings: dict[str, list[tuple[float, float]]] = {n: [] for n in models}
    for r in range(rounds):  # round-robin: drifting machine load hits every variant alike
        for name, m in models.items():
            timings[name].append(m.timed_decode(prompt, tokens[name]))
        print(f"[timing] round {r + 1}/{rounds} done", flush=True)

    base = {"onnx": "fp32", "torch": "torch-fp32"}
    for name, samples in timings.items():
        row = rows[name]
        row["prefill_ms"] = statistics.median(s[0] for s in samples)
        row["decode_ms"] = statistics.median(s[1] for s in samples)
        if tokens[name] < new_tokens:
            row["decode_note"] = f"decode timed on {tokens[name]} tokens (slow)"
    fp32_ppl = rows["fp32"].get("perplexity")
    for row in rows.values():
        ref = rows.get(base[row.get("kind", "onnx")], {}).get("decode_ms")
        if row.get("decode_ms") and ref:
            row["speedup"] = ref / row["decode_ms"]
        if row.get("perplexity") and fp32_ppl:
            row["ppl_delta_pct"] = 100 * (row["perplexity"] / fp32_ppl - 1)
    mark_dominated(rows)

    text = table(rows)
    header = (
        f"SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to fp32), {windows.size - n_eval} predicted "
        f"tokens in {n_eval} windows of {WINDOW}; decode after a {PROMPT}-token prompt, "
        f"{new_tokens} tokens, 1 thread, median of {rounds} interleaved rounds; "
        f"CPU int8 flags: {cpu.describe()}"
    )
    print("\n" + header + "\n\n" + text)
    report = {
        "command": " ".join(sys.argv),
        "header": header,
        "cpu": cpu.as_dict(),
        "speedup_reference": "onnx rows vs fp32 (ONNX Runtime), torch rows vs torch-fp32",
        "eval_windows": n_eval,
        "window": WINDOW,
        "calib_windows": CALIB_WINDOWS,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "notes": notes,
        "wall_s": round(time.perf_counter() - began),
        "rows": {n: {k: v for k, v in r.items() if k != "path"} for n, r in rows.items()},
    }
    args.json.write_text(json.dumps(report, indent=2, default=float) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
