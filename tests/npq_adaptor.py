"""npq: a small numpy adaptor with real int8 quantization, to test the conformance suite.

The model is a two-layer perceptron (``relu(x @ w1) @ w2``, ops ``fc1`` and ``fc2``);
quantizing it fake-quantizes each op's weights per channel (int8, symmetric) and its input
with a calibrated uint8 range, exactly as a real int8 backend would round. Saved models
are ``.npqm`` files (an ``.npz`` archive with a marker entry).

``NPQ_BUG`` plants one bug the conformance suite must catch:

* ``coarse_scales`` - activation scales 10x too coarse;
* ``npz_detection`` - detection claims any zip archive (so lpq's ``.npz`` data too);
* ``mutates`` - quantize writes the quantized weights into the caller's model;
* ``ignores_sampling`` - calibration reads all the data, not ``calib_sampling_size``.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import lpq

FRAMEWORK = "npq"
SUFFIX = ".npqm"
MARKER = "__npq__"
#: Installed next to the module (``npq_adaptor.yaml``, holding ``CAPABILITY_YAML``).
CAPABILITY = Path(__file__).with_suffix(".yaml")
CAPABILITY_YAML = """\
- version:
    name: default
  precisions: [int8, uint8, fp32]
  ops:
    int8: [MatMul]
    fp32: ['*']
  capabilities:
    int8:
      static:
        MatMul:
          weight: {dtype: [int8], scheme: [sym], granularity: [per_channel]}
          activation: {dtype: [uint8], scheme: [asym], algorithm: [minmax]}
"""
OPS = (("fc1", "w1"), ("fc2", "w2"))


def bug(name: str) -> bool:
    return os.environ.get("NPQ_BUG") == name


@dataclass
class NpqModel:
    """fp32 weights; ``qparams[op]`` = (input scale, zero point) once quantized."""

    weights: dict[str, np.ndarray]
    qparams: dict[str, tuple[float, int]] = field(default_factory=dict)

    def run(self, x: np.ndarray, capture: dict[str, list[np.ndarray]] | None = None) -> Any:
        for index, (op, weight) in enumerate(OPS):
            if op in self.qparams:
                scale, zero = self.qparams[op]
                x = (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale
            x = (x @ self.weights[weight]).astype(np.float32)
            if capture is not None and op in capture:
                capture[op].append(x.copy())
            if index == 0:
                x = np.maximum(x, 0)
        return x


def _load(model: Any) -> NpqModel:
    if isinstance(model, NpqModel):
        return model
    path = Path(model)
    if not path.is_file():
        raise lpq.ModelError(f"{path} does not exist", hint="check the path")
    with np.load(path, allow_pickle=False) as data:
        weights = {name: data[name] for _, name in OPS}
        qparams = {
            op: (float(data[f"{op}_s"]), int(data[f"{op}_z"])) for op, _ in OPS if f"{op}_s" in data
        }
    return NpqModel(weights, qparams)


def _batches(dataloader: Iterable[Any]) -> Iterator[tuple[np.ndarray, Any]]:
    for item in dataloader:
        inputs, labels = lpq.split_batch(item)
        x = np.asarray(inputs, np.float32)
        if x.ndim != 2 or x.shape[1] != 8:
            raise lpq.DataError(f"inputs of shape {x.shape}; the model takes (N, 8)")
        yield x, labels


def _is_npq_file(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            if bug("npz_detection"):
                return True
            return path.suffix == SUFFIX and f"{MARKER}.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


@lpq.hookimpl
def lpq_register_adaptors(register: Any) -> None:
    register(lpq.AdaptorInfo(FRAMEWORK, "numpy", [CAPABILITY], model_suffixes=(SUFFIX,)))


@lpq.hookimpl
def lpq_detect_framework(model: Any) -> str | None:
    if isinstance(model, NpqModel):
        return FRAMEWORK
    if isinstance(model, str | Path) and Path(model).is_file() and _is_npq_file(Path(model)):
        return FRAMEWORK
    return None


@lpq.hookimpl
def lpq_query_fw_capability(framework: str, model: Any, dataloader: Any, options: Any) -> Any:
    if framework != FRAMEWORK:
        return None
    spec = lpq.load_capability(CAPABILITY, FRAMEWORK, None)
    return spec.build([(op, "MatMul") for op, _ in OPS], None)


@lpq.hookimpl
def lpq_quantize(framework: str, model: Any, tune_cfg: Any, calib_dataloader: Any) -> Any:
    if framework != FRAMEWORK:
        return None
    source = _load(model)
    quantized_ops = {name for name, op in tune_cfg.ops.items() if op.quantized}
    if not quantized_ops:
        return NpqModel(dict(source.weights))
    calib = (
        calib_dataloader
        if bug("ignores_sampling")
        else lpq.take_samples(calib_dataloader, tune_cfg.calib_sampling_size)
    )
    seen: dict[str, list[np.ndarray]] = {"fc1": [], "fc2": []}
    for x, _ in _batches(calib):
        seen["fc1"].append(x)
        seen["fc2"].append(np.maximum(x @ source.weights["w1"], 0))
    if not seen["fc1"]:
        raise lpq.DataError("the calibration data is empty")
    weights = {} if bug("mutates") else dict(source.weights)
    qparams = {}
    for op, weight in OPS:
        if (op, "MatMul") not in quantized_ops:
            weights.setdefault(weight, source.weights[weight])
            continue
        w = source.weights[weight]
        w_scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127
        dequantized = (np.clip(np.round(w / w_scale), -127, 127) * w_scale).astype(np.float32)
        if bug("mutates"):
            source.weights[weight][...] = dequantized
            weights[weight] = source.weights[weight]
        else:
            weights[weight] = dequantized
        values = np.concatenate(seen[op])
        low, high = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
        scale = max(high - low, 1e-12) / 255 * (10 if bug("coarse_scales") else 1)
        qparams[op] = (scale, round(-low / scale))
    return NpqModel(weights, qparams)


@lpq.hookimpl
def lpq_evaluate(
    framework: str, model: Any, dataloader: Any, postprocess: Any, metrics: Any, measurer: Any,
    iteration: Any,
) -> Any:  # fmt: skip
    if framework != FRAMEWORK:
        return None
    npq = _load(model)
    return lpq.evaluate_batches(
        _batches(dataloader), npq.run, metrics, postprocess=postprocess, measurer=measurer,
        iteration=iteration,
    )  # fmt: skip


@lpq.hookimpl
def lpq_inspect_tensor(
    framework: str, model: Any, dataloader: Any, op_names: Any, kind: str, iteration: Any
) -> Any:
    if framework != FRAMEWORK:
        return None
    npq = _load(model)
    names = list(op_names) if op_names is not None else [op for op, _ in OPS]
    capture: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for index, (x, _) in enumerate(_batches(dataloader)):
        if iteration is not None and index >= iteration:
            break
        npq.run(x, capture)
    weights = {op: {w: npq.weights[w]} for op, w in OPS if op in names}
    return lpq.Inspection(activations=capture, weights=weights if kind != "activation" else {})


@lpq.hookimpl
def lpq_save_model(framework: str, model: Any, path: Path) -> Any:
    if framework != FRAMEWORK:
        return None
    npq = _load(model)
    target = Path(path).with_suffix(SUFFIX)
    arrays: dict[str, Any] = {MARKER: np.array(1), **npq.weights}
    for op, (scale, zero) in npq.qparams.items():
        arrays[f"{op}_s"], arrays[f"{op}_z"] = np.array(scale), np.array(zero)
    with lpq.atomic_write(target, "wb") as handle:
        np.savez(handle, **arrays)
    return target


@lpq.hookimpl
def lpq_load_model(framework: str, path: Path) -> Any:
    if framework != FRAMEWORK:
        return None
    return _load(path)


def register_for_test(lpq_plugin: Any, folder: Path, monkeypatch: Any) -> Any:
    """Register this module with ``lpq_plugin`` for one test (its YAML written to
    ``folder``); returns the module."""
    import sys

    module = sys.modules[__name__]
    capability = folder / "npq.yaml"
    capability.write_text(CAPABILITY_YAML)
    monkeypatch.setattr(module, "CAPABILITY", capability)
    monkeypatch.delenv("NPQ_BUG", raising=False)
    lpq_plugin(module, name="npq")
    return module
