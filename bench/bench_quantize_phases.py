"""Where `lpq quantize` spends CPU and memory outside latency timing, phase by phase, beside
ONNX Runtime's own `quantize_static` on the same model and data.

Each row is one run in a fresh process (`--no-latency-aware`: latency timing is measured by
bench_quantize_cost.py). lpq runs in-process under a tracer that records process CPU time
and resident memory at the start and end of each phase (prepare, calibrate, range choice,
final build, fidelity check with its side-by-side timing); the process's total CPU (user +
system, all threads) and peak RSS come from `os.wait4`. ORT's row is `quant_pre_process`
then `quantize_static` (QDQ, MinMax defaults) on the same calibration batches.

    python bench/bench_quantize_phases.py MODEL.onnx CALIB.npz [--eval EVAL.npz]
        [--batch-size 1] [--json out.json] [--repeat 1]

Print a table; write JSON (rows, load average, CPU flags). Compare variants in one run: the
machine is shared, so read ratios, not absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Phases traced in the lpq child: (module, function, label).
PHASES = [
    ("lpq_onnxrt.model_io", "_prepare", "prepare"),
    ("lpq_onnxrt.calibration.collect", "collect_statistics", "calibrate"),
    ("lpq_onnxrt.passes.static_plan", "resolve", "range choice"),
    ("lpq_onnxrt.passes.static_plan", "_apply", "final build"),
    ("lpq.eval.fidelity", "measure_fidelity", "fidelity check"),
]

_LPQ_CHILD = r"""
import functools, importlib, json, resource, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6
phases, out = json.loads(sys.argv[1]), sys.argv[2]
records = []
for module, name, label in phases:
    mod = importlib.import_module(module)
    fn = getattr(mod, name)
    def traced(*a, _fn=fn, _label=label, **k):
        start, before = time.process_time(), rss()
        try:
            return _fn(*a, **k)
        finally:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
            records.append({"phase": _label, "cpu_s": round(time.process_time() - start, 3),
                            "rss_before_mb": round(before), "rss_after_mb": round(rss()),
                            "peak_so_far_mb": round(peak)})
    setattr(mod, name, traced)
    if module == "lpq_onnxrt.calibration.collect":
        importlib.import_module("lpq_onnxrt.calibration").collect_statistics = traced
from lpq.cli import main
try:
    main(sys.argv[3:])
finally:
    with open(out, "w") as f:
        json.dump({"phases": records, "torch_imported": "torch" in sys.modules}, f)
"""

_ORT_CHILD = r"""
import sys, numpy as np
from onnxruntime.quantization import CalibrationDataReader, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
model, calib, batch, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
data = dict(np.load(calib))
count = len(next(iter(data.values())))
feeds = [{k: v[i:i + batch] for k, v in data.items()} for i in range(0, count, batch)]
class Reader(CalibrationDataReader):
    def __init__(self):
        self.it = iter(feeds)
    def get_next(self):
        return next(self.it, None)
quant_pre_process(model, out + ".pre.onnx")
quantize_static(out + ".pre.onnx", out, Reader())
"""


def _child(argv: list[str], cwd: str | None = None) -> dict[str, Any]:
    """Run ``argv`` to completion: wall, CPU (user + system) and peak RSS from wait4."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd
    )
    _, status, usage = os.wait4(proc.pid, 0)
    output = proc.stdout.read() if proc.stdout else ""
    return {
        "exit": os.waitstatus_to_exitcode(status),
        "wall_s": round(time.perf_counter() - start, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "user_s": round(usage.ru_utime, 2),
        "sys_s": round(usage.ru_stime, 2),
        "peak_mb": round(usage.ru_maxrss / 1e3),
        "tail": output.strip().splitlines()[-3:],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lpq-phases-") as tmp:
        for k in range(args.repeat):
            trace = Path(tmp) / f"trace{k}.json"
            cli = ["quantize", str(args.model), "--calib", str(args.calib), "--no-latency-aware"]
            cli += ["--batch-size", str(args.batch_size), "--out", str(Path(tmp) / "lpq.onnx")]
            if args.eval:
                cli += ["--eval", str(args.eval)]
            load = os.getloadavg()[0]
            row = _child([sys.executable, "-c", _LPQ_CHILD, json.dumps(PHASES), str(trace), *cli])
            row.update(json.loads(trace.read_text()) if trace.exists() else {})
            rows.append({"tool": "lpq quantize --no-latency-aware", "load": load, **row})
            load = os.getloadavg()[0]
            model, calib = (str(Path(p).resolve()) for p in (args.model, args.calib))
            ort = [sys.executable, "-c", _ORT_CHILD, model, calib]
            ort += [str(args.batch_size), str(Path(tmp) / "ort.onnx")]
            rows.append({"tool": "ORT quant_pre_process + quantize_static", "load": load})
            # In the temporary folder: ORT's shape inference leaves
            # sym_shape_infer_temp.onnx and its external data in the working directory
            # when it gives up (NudeNet's YOLOv8).
            rows[-1].update(_child(ort, cwd=tmp))
    return {"model": str(args.model), "rows": rows, "cpu": _cpu_flags()}


def _cpu_flags() -> str:
    try:
        import lpq

        return str(lpq.cpu_features().describe())
    except Exception:  # the table still prints without it
        return "unknown"


def _print(result: dict[str, Any]) -> None:
    print(f"{result['model']}  ({result['cpu']})")
    print(f"{'tool':42} {'load':>5} {'cpu s':>7} {'sys s':>6} {'wall s':>7} {'peak MB':>8}")
    for row in result["rows"]:
        print(
            f"{row['tool']:42} {row['load']:5.1f} {row['cpu_s']:7.2f} {row['sys_s']:6.2f} "
            f"{row['wall_s']:7.1f} {row['peak_mb']:8d}"
        )
        if row.get("exit"):
            # A failed run's seconds are no cost to compare (ORT's quant_pre_process stops
            # with "Incomplete symbolic shape inference" on NudeNet's YOLOv8).
            print(f"    FAILED (exit {row['exit']}): {(row.get('tail') or [''])[-1][:100]}")
        for phase in row.get("phases", []):
            print(
                f"    {phase['phase']:38} {'':5} {phase['cpu_s']:7.2f} {'':6} {'':7} "
                f"{phase['peak_so_far_mb']:8d}  (rss {phase['rss_before_mb']} -> "
                f"{phase['rss_after_mb']})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("calib", type=Path)
    parser.add_argument("--eval", type=Path)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args)
    _print(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
