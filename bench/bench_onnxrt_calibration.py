"""Calibration wall time and peak memory: lpq's streaming histograms vs ORT's calibrators.

Compares, on a ResNet-style conv net built here with random weights (input 1x3xSxS,
64-256 channels), at 32 and 128 calibration samples:

- ``lpq-kl`` / ``lpq-percentile``: ``lpq_onnxrt.calibration.collect_statistics`` followed by
  ``compute_range`` for every tensor;
- ``ort-entropy`` / ``ort-percentile``: ``onnxruntime.quantization.create_calibrator`` with
  ``CalibrationMethod.Entropy`` / ``CalibrationMethod.Percentile`` (their defaults),
  ``collect_data`` and ``compute_data``.

Both calibrate the same tensors: every input and output of every node, except weights.
Each variant runs in a fresh subprocess so its peak RSS (VmHWM) is its own;
"growth" is peak RSS minus the RSS just before calibration started (model loaded, no
data yet). Inputs are generated one sample at a time on both sides, so the input data
itself never inflates the numbers. Variants are interleaved; timings on a shared machine
are noisy, so read the ratios.

Run:  .venv/bin/python bench/bench_onnxrt_calibration.py  [--size 224] [--samples 32 128]
Writes bench/results/onnxrt_calibration.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "onnxrt_calibration.json"
VARIANTS = ("lpq-kl", "ort-entropy", "lpq-percentile", "ort-percentile")


def build_resnet_like(size: int, seed: int = 0) -> Any:
    """A ResNet-18-style net (stem, 3 stages of basic blocks, 64/128/256 channels)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: list[Any] = []
    inits: list[Any] = []
    counter = iter(range(10_000))

    def conv(x: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
        i = next(counter)
        w = rng.normal(0.0, np.sqrt(2.0 / (cin * k * k)), size=(cout, cin, k, k))
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"conv{i}_w"))
        inits.append(
            numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"conv{i}_b")
        )
        pad = k // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"conv{i}_w", f"conv{i}_b"],
                [f"conv{i}"],
                name=f"Conv_{i}",
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
            )
        )
        if not relu:
            return f"conv{i}"
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"Relu_{i}"))
        return f"relu{i}"

    def block(x: str, cin: int, cout: int, stride: int) -> str:
        y = conv(x, cin, cout, 3, stride, relu=True)
        y = conv(y, cout, cout, 3, 1, relu=False)
        skip = x if stride == 1 and cin == cout else conv(x, cin, cout, 1, stride, relu=False)
        i = next(counter)
        nodes.append(helper.make_node("Add", [y, skip], [f"add{i}"], name=f"Add_{i}"))
        nodes.append(helper.make_node("Relu", [f"add{i}"], [f"out{i}"], name=f"Relu_out{i}"))
        return f"out{i}"

    x = conv("input", 3, 64, 7, 2, relu=True)
    nodes.append(
        helper.make_node(
            "MaxPool",
            [x],
            ["pool"],
            name="MaxPool_0",
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1] * 4,
        )
    )
    x = "pool"
    for cin, cout, stride in [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2)]:
        x = block(x, cin, cout, stride)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="GAP_0"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="Flatten_0"))
    fc = rng.normal(0.0, 0.05, size=(256, 10)).astype(np.float32)
    inits.append(numpy_helper.from_array(fc, "fc_w"))
    nodes.append(helper.make_node("MatMul", ["flat", "fc_w"], ["logits"], name="MatMul_fc"))
    graph = helper.make_graph(
        nodes,
        "resnet_like",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def sample(index: int, size: int) -> np.ndarray:
    """Calibration sample ``index``, generated on demand (never all held at once)."""
    rng = np.random.default_rng(1000 + index)
    return rng.normal(0.0, 1.0, size=(1, 3, size, size)).astype(np.float32)


def calibrated_tensors(model: Any) -> list[str]:
    weights = {init.name for init in model.graph.initializer}
    names = [n for node in model.graph.node for n in (*node.input, *node.output)]
    return [n for n in dict.fromkeys(names) if n and n not in weights]


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def rss_mib() -> float:
    return _status_mib("VmRSS")


def peak_rss_mib() -> float:
    """This process image's peak RSS.

    VmHWM, not ``ru_maxrss``: Linux carries ``ru_maxrss`` over fork and exec, so a
    worker would report its parent's peak.
    """
    peak = _status_mib("VmHWM")
    if peak == peak:  # not NaN
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_lpq(model_path: str, variant: str, samples: int, size: int) -> dict[str, list[float]]:
    import onnx

    from lpq_onnxrt.calibration import collect_statistics

    model = onnx.load(model_path)
    names = calibrated_tensors(model)
    feeds = ({"input": sample(i, size)} for i in range(samples))
    stats = collect_statistics(model, names, feeds, show_progress=False)
    if variant == "lpq-kl":  # ORT Entropy's default: asymmetric
        return {n: list(stats.compute_range(n, "kl", symmetric=False)) for n in names}
    return {n: list(stats.compute_range(n, "percentile", symmetric=True)) for n in names}


def run_ort(model_path: str, variant: str, samples: int, size: int) -> dict[str, list[float]]:
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, create_calibrator

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.index = 0

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.index >= samples:
                return None
            self.index += 1
            return {"input": sample(self.index - 1, size)}

    method = CalibrationMethod.Entropy if variant == "ort-entropy" else CalibrationMethod.Percentile
    with tempfile.TemporaryDirectory() as folder:
        calibrator = create_calibrator(
            Path(model_path),
            augmented_model_path=f"{folder}/augmented.onnx",
            calibrate_method=method,
        )
        calibrator.collect_data(Reader())
        data = calibrator.compute_data()
    return {name: [float(v) for v in rng.range_value] for name, rng in data.data.items()}


def worker(variant: str, samples: int, size: int, model_path: str) -> None:
    """Runs one variant in this (fresh) process and prints its measurements as JSON."""
    import onnxruntime  # noqa: F401  (import cost is not calibration cost)

    import lpq_onnxrt.calibration  # noqa: F401

    before = rss_mib()
    start = time.perf_counter()
    run = run_lpq if variant.startswith("lpq") else run_ort
    ranges = run(model_path, variant, samples, size)
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    result = {"seconds": seconds, "peak_rss_mib": peak, "rss_before_mib": before, "ranges": ranges}
    print("RESULT " + json.dumps(result))


def spawn(variant: str, samples: int, size: int, model_path: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", variant, str(samples), str(size), model_path]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{variant} at {samples} samples failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def threshold(r: list[float]) -> float:
    return max(-r[0], r[1])


def threshold_ratio(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    """Median over shared tensors of max|range| in ``a`` / in ``b`` (1.0 = same)."""
    ratios = [threshold(a[n]) / threshold(b[n]) for n in a if n in b and threshold(b[n]) > 0]
    return float(np.median(ratios)) if ratios else float("nan")


def exact_percentiles(model: Any, names: list[str], samples: int, size: int) -> dict[str, float]:
    """np.percentile(|x|, 99.999) of every tensor over all samples (holds them all)."""
    import onnx
    import onnxruntime

    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    outputs = {o.name for o in augmented.graph.output}
    augmented.graph.output.extend(
        onnx.ValueInfoProto(name=n) for n in names if n not in outputs and n != "input"
    )
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(augmented.SerializeToString(), options)
    order = [o.name for o in session.get_outputs()]
    held: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for i in range(samples):
        feed = {"input": sample(i, size)}
        held["input"].append(feed["input"].ravel())
        for name, value in zip(order, session.run(None, feed)):
            if name in held:
                held[name].append(np.abs(value).ravel())
    result = {}
    for name in names:
        result[name] = float(np.percentile(np.abs(np.concatenate(held.pop(name))), 99.999))
    return result


def relative_errors(ranges: dict[str, list[float]], exact: dict[str, float]) -> list[float]:
    return [abs(threshold(ranges[n]) - t) / t for n, t in exact.items() if t > 0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    parser.add_argument("--samples", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        variant, samples, size, path = args.worker
        worker(variant, int(samples), int(size), path)
        return

    import onnx
    import onnxruntime

    rows: list[dict[str, Any]] = []
    checked: dict[str, Any] = {}
    accuracy: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        model_path = f"{folder}/resnet_like.onnx"
        model = build_resnet_like(args.size)
        onnx.save(model, model_path)
        num_tensors = len(calibrated_tensors(model))
        for samples in args.samples:
            results = {}
            for variant in VARIANTS:  # interleaved: lpq and ORT alternate
                results[variant] = spawn(variant, samples, args.size, model_path)
                print(
                    f"  {variant:15s} {samples:4d} samples: {results[variant]['seconds']:.1f} s",
                    flush=True,
                )
            if samples == min(args.samples):
                checked = results
            for variant, result in results.items():
                peer = "ort-entropy" if variant.endswith("kl") else "ort-percentile"
                rows.append(
                    {
                        "variant": variant,
                        "samples": samples,
                        "seconds": round(result["seconds"], 2),
                        "peak_rss_mib": round(result["peak_rss_mib"], 1),
                        "growth_mib": round(result["peak_rss_mib"] - result["rss_before_mib"], 1),
                        "threshold_vs_ort": round(
                            threshold_ratio(result["ranges"], results[peer]["ranges"]), 3
                        )
                        if variant.startswith("lpq")
                        else None,
                    }
                )

    # Accuracy against exact numpy on the same samples; after all memory measurements,
    # since it holds every activation in this process.
    low = min(args.samples)
    exact = exact_percentiles(model, calibrated_tensors(model), low, args.size)
    for variant in ("lpq-percentile", "ort-percentile"):
        errors = relative_errors(checked[variant]["ranges"], exact)
        accuracy[variant] = {
            "samples": low,
            "median_relative_error": round(float(np.median(errors)), 5),
            "max_relative_error": round(float(np.max(errors)), 5),
        }
    del exact

    print(
        f"\nResNet-style net, input 1x3x{args.size}x{args.size}, {num_tensors} tensors calibrated"
    )
    header = (
        f"{'variant':16s}{'samples':>8s}{'time s':>9s}"
        f"{'peak RSS MiB':>14s}{'growth MiB':>12s}{'thr/ORT':>9s}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ratio = row["threshold_vs_ort"]
        width = "" if ratio is None else f"{ratio:.3f}"
        print(
            f"{row['variant']:16s}{row['samples']:8d}{row['seconds']:9.2f}"
            f"{row['peak_rss_mib']:14.1f}{row['growth_mib']:12.1f}{width:>9s}"
        )
    by = {(r["variant"], r["samples"]): r for r in rows}
    summary = {}
    top = max(args.samples)
    if ("lpq-kl", top) in by and ("ort-entropy", top) in by:
        summary["lpq_kl_peak_over_ort_entropy_peak"] = round(
            by[("lpq-kl", top)]["peak_rss_mib"] / by[("ort-entropy", top)]["peak_rss_mib"], 3
        )
        summary["lpq_kl_growth_over_ort_entropy_growth"] = round(
            by[("lpq-kl", top)]["growth_mib"] / by[("ort-entropy", top)]["growth_mib"], 3
        )
        print(
            f"\nat {top} samples lpq kl peak RSS ="
            f" {summary['lpq_kl_peak_over_ort_entropy_peak']:.3f} x ORT Entropy's"
            f" (growth {summary['lpq_kl_growth_over_ort_entropy_growth']:.3f} x)"
        )
    for variant in ("lpq-kl", "lpq-percentile"):
        if (variant, low) in by and (variant, top) in by and top != low:
            ratio = by[(variant, top)]["peak_rss_mib"] / by[(variant, low)]["peak_rss_mib"]
            summary[f"{variant}_peak_{top}_over_{low}"] = round(ratio, 3)
            print(f"{variant} peak RSS {top} vs {low} samples: {ratio:.3f} x")

    for variant, acc in accuracy.items():
        print(
            f"{variant} 99.999th-percentile threshold vs exact np.percentile"
            f" ({acc['samples']} samples): median error {acc['median_relative_error']:.2%},"
            f" max {acc['max_relative_error']:.2%}"
        )

    from lpq import write_json

    write_json(
        RESULTS,
        {
            "benchmark": "onnxrt calibration: lpq streaming histograms vs ORT calibrators",
            "command": "python bench/bench_onnxrt_calibration.py " + " ".join(sys.argv[1:]),
            "model": f"ResNet-style conv net, input 1x3x{args.size}x{args.size}, random weights",
            "tensors_calibrated": num_tensors,
            "onnxruntime": onnxruntime.__version__,
            "machine": platform.machine(),
            "notes": "each variant in a fresh subprocess; growth = peak RSS minus RSS before"
            " calibration; thr/ORT = median over tensors of lpq max|range| / ORT max|range|;"
            " percentile_error = |threshold - exact np.percentile(|x|, 99.999)| / exact",
            "rows": rows,
            "summary": summary,
            "percentile_accuracy": accuracy,
        },
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
