"""Where the memory of an lpq weight-only build goes: an RSS timeline per variant.

    .venv/bin/python bench/llm/wo_memory.py --variants lpq-rtn,lpq-scale-search,lpq-gptq

``run.py`` reports one number per build (the child's max RSS). To cut that peak one has
to know *when* it happens, and tracemalloc cannot say: the weights live in numpy arrays
ORT and protobuf allocate outside Python's allocator. So each variant is built in a
fresh child process (the same build function ``run.py`` calls) while a thread samples
the process RSS every ``--interval`` seconds, and every log record of ``lpq*`` loggers is
stamped with the RSS at that moment. The child prints the peak, the log line just before
it, and a compact timeline; the driver prints one table and writes
``bench/llm/wo_memory.json``. Nothing here is timed for speed: wall time is reported
beside, as ``run.py`` does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DEFAULT_CACHE = Path("/tmp/lpq-llm-bench")


class Sampler:
    """RSS (MB) of this process every ``interval`` s, and log records stamped with it."""

    def __init__(self, interval: float) -> None:
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.start = time.perf_counter()
        self.samples: list[tuple[float, float]] = []
        self.marks: list[tuple[float, float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> float:
        return float(self.proc.memory_info().rss) / (1 << 20)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - self.start, self.rss()))
            self._stop.wait(self.interval)

    def mark(self, message: str) -> None:
        self.marks.append((time.perf_counter() - self.start, self.rss(), message[:160]))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class _MarkHandler(logging.Handler):
    def __init__(self, sampler: Sampler) -> None:
        super().__init__(logging.DEBUG)
        self.sampler = sampler

    def emit(self, record: logging.LogRecord) -> None:
        self.sampler.mark(f"{record.name}: {record.getMessage()}")


#: Functions whose entry and exit are marked on the timeline: (module, attribute).
PHASES = (
    ("lpq_onnxrt.model_io", "prepare"),
    ("lpq_onnxrt.quantize", "quantize"),
    ("lpq_onnxrt.quantize", "weight_only_pass"),
    ("lpq_onnxrt.precision", "quantized_ops"),
    ("lpq_onnxrt.persist", "save"),
)


def _wrap_phases(sampler: Sampler) -> None:
    import importlib

    for module_name, attr in PHASES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        inner = getattr(module, attr, None)
        if inner is None:
            continue

        def wrapped(*a: Any, _inner: Any = inner, _name: str = attr, **kw: Any) -> Any:
            sampler.mark(f"> {_name}")
            try:
                return _inner(*a, **kw)
            finally:
                sampler.mark(f"< {_name}")

        setattr(module, attr, wrapped)


def child(name: str, cache: Path, interval: float) -> dict[str, Any]:
    """Build ``name`` in this process under a :class:`Sampler`; the timeline as JSON."""
    import model as llm_model
    import numpy as np
    import onnx_lpq

    builds = dict(onnx_lpq.variants())
    calib = np.load(cache / "calib.npy")
    with tempfile.TemporaryDirectory(prefix="lpq-wo-mem-") as tmp:
        ctx = llm_model.BuildContext(cache, Path(tmp), calib)
        with Sampler(interval) as sampler:
            handler = _MarkHandler(sampler)
            for logger_name in ("lpq", "lpq_onnxrt"):
                logger = logging.getLogger(logger_name)
                logger.addHandler(handler)
                logger.setLevel(logging.DEBUG)
            _wrap_phases(sampler)
            sampler.mark("start")
            builds[name](ctx)
            sampler.mark("built")
        size = sum(f.stat().st_size for f in Path(tmp).iterdir())
    peak_t, peak = max(sampler.samples, key=lambda s: s[1]) if sampler.samples else (0.0, 0.0)
    before = [m for m in sampler.marks if m[0] <= peak_t]
    return {
        "variant": name,
        "wall_s": round(sampler.marks[-1][0], 1),
        "peak_mb": round(peak),
        "peak_at_s": round(peak_t, 1),
        "last_log_before_peak": before[-1][2] if before else None,
        "size_mb": round(size / (1 << 20)),
        "marks": [(round(t, 2), round(r), m) for t, r, m in sampler.marks],
        "samples": [
            (round(t, 2), round(r))
            for t, r in sampler.samples[:: max(1, len(sampler.samples) // 400)]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="lpq-rtn,lpq-scale-search,lpq-gptq")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--json", type=Path, default=HERE / "wo_memory.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--marks", action="store_true", help="print every log mark")
    args = parser.parse_args()
    if args.child:
        print("wo-memory " + json.dumps(child(args.child, args.cache, args.interval)), flush=True)
        return
    rows = []
    for name in args.variants.split(","):
        cmd = [sys.executable, __file__, "--child", name, "--cache", str(args.cache)]
        cmd += ["--interval", str(args.interval)]
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
        found = [ln for ln in done.stdout.splitlines() if ln.startswith("wo-memory ")]
        if not found:
            print(f"{name}: failed\n{done.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(found[-1][len("wo-memory ") :])
        rows.append(row)
        if args.marks:
            for t, rss, message in row["marks"]:
                print(f"  {t:7.2f} s {rss:6d} MB  {message}")
        print(
            f"{name}: peak {row['peak_mb']} MB at {row['peak_at_s']} s of {row['wall_s']} s "
            f"(after: {row['last_log_before_peak']})",
            flush=True,
        )
    print(f"\nload: {os.getloadavg()}")
    print("| variant | peak MB | wall s | size MB | peak during |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['variant']} | {row['peak_mb']} | {row['wall_s']} | {row['size_mb']} "
            f"| {row['last_log_before_peak']} |"
        )
    args.json.write_text(json.dumps({"load": os.getloadavg(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
