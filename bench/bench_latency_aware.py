"""Latency-aware quantization on and off: lpq-tf, lpq-mxnet and lpq-torch example models.

For each model: ``lpq.quantize`` with ``latency_aware=False`` (every op int8, as before)
and with the default (latency-aware on), then the fp32 model and both results timed
interleaved in one process with core's timer (:func:`lpq.latency.interleaved`, median of
rounds), at batch 1. LiteRT runs with 1 thread (lpq-tf's default for the search); MXNet
with its OpenMP default (``OMP_NUM_THREADS``). Models (random weights where not the
digits CNN of the adaptors' tests, so no downloads):

* tf: the digits CNN (8x8x1), MobileNetV2 alpha 0.35 at 96x96 (BatchNorm statistics
  settled on one batch);
* mxnet: the digits CNN (1x8x8), Gluon model zoo mobilenet0.25 at 1x3x96x96;
* torch: the digits CNN (1x8x8, calibration batch 8) and Silero VAD's network with the
  published weights (576-sample chunks, calibration batch 8), timed compiled (Inductor,
  as lpq-torch's evaluation and search time them) at batch 1 *and* at the calibration
  batch (the two shapes lpq-torch's search judges). ``--torch-old-step REV`` adds the
  latency-aware step lpq-torch had at git revision REV (its own search, before it moved
  onto core's) as a variant, quantized and timed in the same run.

MXNet needs its own environment:

    .venv/bin/python bench/bench_latency_aware.py --framework tf
    .venv-mxnet/bin/python bench/bench_latency_aware.py --framework mxnet
    .venv/bin/python bench/bench_latency_aware.py --framework torch --torch-old-step 9e5b634

Each prints a table and writes bench/results/latency_aware_<framework>.json with
``lpq.cpu_features().as_dict()``. Timings on a shared machine are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

import lpq  # noqa: E402
from lpq.latency import interleaved  # noqa: E402


def tf_models() -> tuple[dict[str, tuple[Any, Any]], Callable[..., Callable[[], object]]]:
    sys.path.insert(0, str(ROOT / "plugins" / "lpq-tf" / "tests"))
    import keras
    from tf_testmodels import calib_loader, digits_cnn

    from lpq_tf.model_io import prepare
    from lpq_tf.qmodel import QuantizedModel
    from lpq_tf.runtime import create_interpreter

    keras.utils.set_random_seed(0)
    mobilenet = keras.applications.MobileNetV2(
        input_shape=(96, 96, 3), alpha=0.35, weights=None, classifier_activation=None
    )
    images = np.random.default_rng(0).random((32, 96, 96, 3), dtype=np.float32)
    norms = [x for x in mobilenet.layers if isinstance(x, keras.layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.0
    mobilenet(images, training=True)
    models = {
        "digits CNN": (digits_cnn(), calib_loader()),
        "MobileNetV2-0.35 96px": (mobilenet, lpq.ArrayLoader(images, batch_size=8)),
    }

    def runner(model: Any, example: np.ndarray) -> Callable[[], object]:
        content = (
            model.content if isinstance(model, QuantizedModel) else prepare(model).float_tflite
        )
        interpreter = create_interpreter(content, 1)
        detail = interpreter.get_input_details()[0]
        interpreter.resize_tensor_input(detail["index"], list(example.shape), strict=False)
        interpreter.allocate_tensors()
        interpreter.set_tensor(detail["index"], example.astype(detail["dtype"]))
        invoke: Callable[[], object] = interpreter.invoke
        return invoke

    return models, runner


def mxnet_models() -> tuple[dict[str, tuple[Any, Any]], Callable[..., Callable[[], object]]]:
    sys.path.insert(0, str(ROOT / "plugins" / "lpq-mxnet" / "tests"))
    warnings.simplefilter("ignore", DeprecationWarning)
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision
    from mxnet_testmodels import digits_split, train_digits_cnn

    from lpq_mxnet.model_io import to_graph

    digits = digits_split()
    mx.random.seed(0)
    net = vision.get_model("mobilenet0.25", pretrained=False)
    net.initialize(mx.init.Xavier())
    images = np.random.default_rng(0).random((32, 3, 96, 96), dtype=np.float32)
    models = {
        "digits CNN": (
            train_digits_cnn(digits),
            lpq.ArrayLoader(digits["train_x"][:200], batch_size=50),
        ),
        "mobilenet0.25 96px": (net, lpq.ArrayLoader(images, batch_size=8)),
    }

    def runner(model: Any, example: np.ndarray) -> Callable[[], object]:
        from lpq_mxnet.model_io import info_of

        block = model if info_of(model) is not None else to_graph(model, example).block()
        x = mx.nd.array(example)

        def run() -> None:
            block(x)
            mx.nd.waitall()

        return run

    return models, runner


def torch_models() -> tuple[dict[str, tuple[Any, Any]], Callable[..., Callable[[], object]]]:
    sys.path.insert(0, str(ROOT / "plugins" / "lpq-torch" / "tests"))
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    from torch_real_models import audio_chunks, vad_case
    from torch_testmodels import DigitsConvNet, calib_loader

    from lpq_torch import evaluate

    torch.manual_seed(0)
    vad = vad_case()
    models = {
        "digits CNN": (DigitsConvNet().eval(), calib_loader(batch=8)),
        "Silero VAD": (vad.model, [audio_chunks(8, seed=20 + i) for i in range(4)]),
    }

    def runner(model: Any, example: np.ndarray) -> Callable[[], object]:
        forward, x = evaluate.forward_for(model), torch.as_tensor(example)

        def run() -> object:
            with torch.inference_mode():
                return forward(((x,), {}))

        return run

    return models, runner


def old_torch_step(revision: str) -> Any:
    """lpq-torch's latency-aware step at ``revision`` (its own search), loaded from git, in
    the shape today's ``lpq_torch.quantize`` calls."""
    import subprocess
    import types
    import weakref

    from lpq_torch import latency  # also makes the package the old module imports from

    path = "plugins/lpq-torch/lpq_torch/latency.py"
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    old = types.ModuleType("lpq_torch._latency_old")
    old.__package__ = "lpq_torch"
    exec(compile(source, f"{revision}:{path}", "exec"), old.__dict__)
    memory = types.SimpleNamespace(latency=weakref.WeakKeyDictionary())  # its decisions
    old.state = types.SimpleNamespace(current=lambda: memory)  # type: ignore[attr-defined]

    class OldStep:
        LATENCY_ATTR = latency.LATENCY_ATTR
        without = staticmethod(latency.without)
        wanted = staticmethod(latency.wanted)

        @staticmethod
        def choose(*args: Any) -> tuple[None, Any]:
            return None, old.choose(*args)

    return OldStep


def latency_of(model: Any) -> dict[str, Any] | None:
    found = getattr(model, "latency", None) or getattr(model, "_lpq_latency", None)
    return dict(found) if found else None


def bench(framework: str, old_step: str | None = None) -> list[dict[str, Any]]:
    models, runner = {"tf": tf_models, "mxnet": mxnet_models, "torch": torch_models}[framework]()
    pm = lpq.get_plugin_manager()
    variants: dict[str, Callable[[], Any]] = {"int8": lambda: False, "latency-aware": lambda: True}
    if old_step:
        from unittest import mock

        import lpq_torch.quantize

        step = old_torch_step(old_step)
        label = f"latency-aware (old step @{old_step})"
        variants[label] = lambda: mock.patch.object(lpq_torch.quantize, "latency", step)
    rows = []
    for title, (model, calib) in models.items():
        first = next(iter(calib))
        first = np.asarray(first[0] if isinstance(first, tuple) else first)
        shapes = {"batch 1": first[:1]}
        if framework == "torch":
            shapes[f"batch {len(first)}"] = first
        results = {}
        for label, how in variants.items():
            patch = how()
            aware = not isinstance(patch, bool) or patch
            began = time.perf_counter()
            conf = lpq.PostTrainingQuantConfig(latency_aware=aware)
            if isinstance(patch, bool):
                quantized = lpq.quantize(model, conf, calib).model
            else:
                with patch:
                    quantized = lpq.quantize(model, conf, calib).model
            results[label] = (quantized, time.perf_counter() - began)
        for shape, example in shapes.items():
            runs = {"fp32": runner(model, example)}
            runs |= {label: runner(results[label][0], example) for label in variants}
            timing = interleaved(runs, min_rounds=30, max_rounds=400, budget_s=3.0, seed=0)
            for label in variants:
                found = pm.quantized_ops(framework, results[label][0])
                decision = latency_of(results[label][0]) or {}
                rows.append(
                    {
                        "framework": framework,
                        "model": title,
                        "shape": shape,
                        "variant": label,
                        "fp32_ms": timing.ms("fp32"),
                        "ms": timing.ms(label),
                        "speedup": 1.0 / timing.ratio(label, "fp32"),
                        "noise": timing.noise(label, "fp32"),
                        "ops_int8": sum(p != "fp32" for p in found.values()),
                        "ops_float": sorted(n for n, p in found.items() if p == "fp32"),
                        "quantize_s": results[label][1],
                        "search": {k: v for k, v in decision.items() if k != "steps"},
                        "search_steps": len(decision.get("steps", [])),
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("tf", "mxnet", "torch"), required=True)
    parser.add_argument(
        "--torch-old-step",
        metavar="REV",
        help="torch: also quantize with lpq-torch's latency-aware step at git revision REV",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["LPQ_CACHE_DIR"] = cache  # measure, do not reuse earlier decisions
        rows = bench(args.framework, args.torch_old_step)
    cpu = lpq.cpu_features().as_dict()
    print(f"\nCPU: {json.dumps(cpu)}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print(f"lpq.cpu_features().describe(): {lpq.cpu_features().describe()}")
    print(
        "\n| framework | model | variant | fp32 ms | ms | speedup | noise | int8 ops | "
        "ops kept float | quantize s |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        shape = f" ({r['shape']})" if r["framework"] == "torch" else ""
        print(
            f"| {r['framework']} | {r['model']}{shape} | {r['variant']} | {r['fp32_ms']:.3f} | "
            f"{r['ms']:.3f} | {r['speedup']:.2f}x | {r['noise']:.0%} | {r['ops_int8']} | "
            f"{len(r['ops_float'])} | {r['quantize_s']:.1f} |"
        )
    out = ROOT / "bench" / "results" / f"latency_aware_{args.framework}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
