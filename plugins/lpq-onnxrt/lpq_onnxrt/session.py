"""Creating ONNX Runtime sessions with lpq's options and clear errors."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpq import ConfigError, ModelError

from . import weights
from .model_io import PROTO_LIMIT, ModelFile
from .weights import tensor_bytes

if TYPE_CHECKING:
    import onnx
    import onnxruntime

#: Initializers from this size on go to a session as arrays, not serialized with the
#: model (:func:`create_session`); smaller ones cost less serialized than handed over.
HANDED_BYTES = 1 << 16


def _allowed_cores() -> int | None:
    """The cores this process may run on, when fewer than the machine has (a parallel
    tuning worker pinned to its share): ORT sizes its thread pool to the machine and
    ignores the affinity, so two threads would spin on one core. ``None``: ORT's default."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = len(os.sched_getaffinity(0))
    return allowed if allowed < (os.cpu_count() or allowed) else None


def build_session_options(
    options: Mapping[str, Any] | None = None,
) -> onnxruntime.SessionOptions:
    """SessionOptions from lpq options: ``intra_op_num_threads``, ``inter_op_num_threads``,
    ``graph_optimization_level`` (``basic``/``extended``/``all``/``disable``), and for
    lpq's own measurements ``enable_profiling`` (a file prefix) and
    ``optimized_model_filepath``."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    options = options or {}
    threads = options.get("intra_op_num_threads", options.get("threads"))
    if threads is None:
        threads = _allowed_cores()
    if threads is not None:
        opts.intra_op_num_threads = int(threads)
    if options.get("inter_op_num_threads") is not None:
        opts.inter_op_num_threads = int(options["inter_op_num_threads"])
    level = options.get("graph_optimization_level")
    if level is not None:
        levels = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }
        if level not in levels:
            raise ConfigError(
                f"unknown graph_optimization_level {level!r}",
                hint=f"choose one of: {', '.join(levels)}",
            )
        opts.graph_optimization_level = levels[level]
    if options.get("enable_profiling"):
        opts.enable_profiling = True
        opts.profile_file_prefix = str(options["enable_profiling"])
    if options.get("optimized_model_filepath"):
        opts.optimized_model_filepath = str(options["optimized_model_filepath"])
    return opts


def providers(options: Mapping[str, Any] | None = None) -> list[str]:
    """Execution providers from ``options['providers']`` / ``execution_provider``
    (default CPU); unknown ones are a ConfigError rather than a silent CPU fallback."""
    import onnxruntime as ort

    options = options or {}
    wanted = (
        options.get("providers") or options.get("execution_provider") or ["CPUExecutionProvider"]
    )
    if isinstance(wanted, str):
        wanted = [wanted]
    available = ort.get_available_providers()
    missing = [p for p in wanted if p not in available]
    if missing:
        raise ConfigError(
            f"execution provider(s) {', '.join(missing)} are not available in this "
            "onnxruntime build",
            hint=f"available: {', '.join(available)}",
        )
    return list(wanted)


def serialized(model: onnx.ModelProto) -> bytes | None:
    """``model`` as one protobuf string; None when it is ``PROTO_LIMIT`` bytes or more.

    Serialized once: ``ByteSize()`` first costs about as much as the serialization
    itself (ddddocr rec, 54 MB: 20 ms; 32 sessions of a cold ``lpq quantize``, 0.6 CPU
    s). Only a model whose initializers alone come near the limit (from their shapes, no
    serialization) is measured first, so that none is serialized just to be dropped."""
    weights = sum(tensor_bytes(tensor) for tensor in model.graph.initializer)
    if weights >= PROTO_LIMIT // 2 and model.ByteSize() >= PROTO_LIMIT:
        return None
    try:
        data = model.SerializeToString()
    except Exception:  # over protobuf's own 2 GiB (Constant nodes the estimate misses)
        return None
    return data if len(data) < PROTO_LIMIT else None


def create_session(
    model: onnx.ModelProto | ModelFile | str | os.PathLike[str],
    options: Mapping[str, Any] | None = None,
    *,
    session_options: onnxruntime.SessionOptions | None = None,
    purpose: str = "",
) -> onnxruntime.InferenceSession:
    """The one place lpq creates an InferenceSession (evaluation, calibration, inspection,
    latency measurement). ``session_options`` replaces the ones built from ``options``;
    models over the protobuf limit go through a temporary file with external data; a path
    (or a :class:`~lpq_onnxrt.model_io.ModelFile`) is opened by ORT itself (with its
    external data, the model held once). ModelError when ORT cannot load the model.

    An in-memory model's initializers of :data:`HANDED_BYTES` or more (but fp32 conv
    weights) are handed to ORT as arrays (``add_external_initializers``) and the rest of
    the model is serialized: serializing them, and ORT parsing and copying them, cost
    more than the session itself (MiniLM, 90 MB: 0.31 -> 0.14 CPU s and 115k -> 32k page
    faults a session, the same outputs and latency). ``session_options`` is used for
    this one session."""
    import onnx
    import onnxruntime as ort

    opts = session_options if session_options is not None else build_session_options(options)
    prov = providers(options)
    if isinstance(model, ModelFile):
        model = model.path
    try:
        if isinstance(model, str | os.PathLike):
            return ort.InferenceSession(os.fspath(model), opts, providers=prov)
        if not opts.optimized_model_filepath and any(
            weights.nbytes(init) >= HANDED_BYTES for init in model.graph.initializer
        ):
            light, blobs = weights.detach(model, HANDED_BYTES, inline=_conv_weights(model))
            light_bytes = serialized(light) if blobs else None
            if light_bytes is not None:
                return weights.session(
                    light, blobs, opts, prov, prepacking=True, light_bytes=light_bytes
                )
        data = serialized(model)
        if data is not None:
            return ort.InferenceSession(data, opts, providers=prov)
        with tempfile.TemporaryDirectory(prefix="lpq-onnxrt-") as tmp:
            path = Path(tmp) / "model.onnx"
            onnx.save_model(model, str(path), save_as_external_data=True, location="model.data")
            return ort.InferenceSession(os.fspath(path), opts, providers=prov)
    except Exception as exc:
        what = f" for {purpose}" if purpose else ""
        raise ModelError(
            f"ONNX Runtime cannot load the model{what} ({type(exc).__name__}: {exc})",
            hint="check the model with onnx.checker.check_model; ops must be supported by "
            "the execution provider",
        ) from None


def _conv_weights(model: onnx.ModelProto) -> set[str]:
    """The initializers fp32 convolutions read as their weight. ORT reorders those into a
    layout of its own (NCHWc) and drops the original, which it cannot do with an array it
    was handed: kept serialized (ddddocr rec, 51 MB of conv weights: handed, every fp32
    session held them twice, peak +45 MB)."""
    from onnx import TensorProto

    floats = {init.name for init in model.graph.initializer if init.data_type == TensorProto.FLOAT}
    return {
        node.input[1]
        for node in model.graph.node
        if node.op_type in ("Conv", "ConvTranspose")
        and len(node.input) > 1
        and node.input[1] in floats
    }


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another C library, or none found)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


def release_freed_memory() -> None:
    """Give the memory of dropped sessions back to the system (glibc's ``malloc_trim``;
    nothing elsewhere).

    A session's weights, prepacked kernels and the serialized model it was made from are
    freed into the allocator's heap, which keeps them: the latency search makes dozens of
    sessions, two at a time, and on ddddocr's recognizer the process held 0.3 GB of such
    freed memory once the search ended (724 -> 403 MB after one trim). Called where
    sessions are dropped in bulk (the timer's rejected candidate, a profile's two)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
