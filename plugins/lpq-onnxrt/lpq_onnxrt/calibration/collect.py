"""Running ONNX Runtime over calibration data to fill :class:`CalibrationStats`.

The statistics and range maths live in :mod:`.histogram` and :mod:`.algorithms` (numpy
only); this module is the one that imports onnx / onnxruntime, inside its functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lpq import ConfigError, DataError, ModelError

from .histogram import CalibrationStats

if TYPE_CHECKING:
    import onnx
    import onnxruntime


#: Default budget for the activations one calibration run may return (bytes).
DEFAULT_MEMORY_BUDGET = 1 << 30
MEMORY_ENV = "LPQ_CALIB_MEMORY_MB"
#: Within the budget, the samples of one run return at most this many times the model's
#: weights in activations, or :data:`RUN_FLOOR` bytes, whichever is more (see
#: :func:`run_budget`).
RUN_WEIGHTS = 4
RUN_FLOOR = 64 << 20


def memory_budget(options: Mapping[str, Any] | None = None) -> int:
    """Bytes of activations a calibration run may hold: ``options['calibration_memory_mb']``,
    else ``$LPQ_CALIB_MEMORY_MB``, else 1024 MiB."""
    value = (options or {}).get("calibration_memory_mb") or os.environ.get(MEMORY_ENV)
    if value in (None, ""):
        return DEFAULT_MEMORY_BUDGET
    try:
        megabytes = float(value)
    except (TypeError, ValueError):
        megabytes = -1.0
    if megabytes <= 0:
        raise ConfigError(
            f"the calibration memory budget must be a positive number of MiB, not {value!r}",
            hint=f"set calibration_memory_mb (or {MEMORY_ENV}) to e.g. 512",
        )
    return int(megabytes * (1 << 20))


def run_budget(model: onnx.ModelProto, budget: int) -> int:
    """Bytes of activations one calibration run returns at most: ``budget``, or less for a
    small model: :data:`RUN_WEIGHTS` times its weights, and at least :data:`RUN_FLOOR`.

    A batch of samples runs in chunks of samples whose activations fit this (the tensors
    still fetched in groups that fit ``budget``: never more runs per sample). The
    statistics do not depend on the chunking (see :mod:`.histogram`). MTCNN's P-Net (28 KB
    of weights, 15 MB of activations per 320x240 picture) ran its batches of 32 whole
    under the 1 GiB budget: 1.2 GB resident after calibration, where ORT's
    ``quantize_static`` peaks at 240 MB; in chunks of 4 pictures, 0.67 GB."""
    from ..weights import nbytes

    weights = sum(nbytes(init) for init in model.graph.initializer)
    return min(budget, max(RUN_FLOOR, RUN_WEIGHTS * weights))


@dataclass
class _Plan:
    """How to run one feed within the budget: samples per run and tensors per run."""

    chunk: int
    groups: list[list[str]]
    #: bytes of one sample of every tensor
    per_sample: int = 0


def _batch_of(feed: Mapping[str, np.ndarray]) -> int | None:
    """The feed's batch size when every non-scalar input leads with the same dimension."""
    leading = {int(np.shape(v)[0]) for v in feed.values() if np.ndim(v) >= 1}
    return leading.pop() if len(leading) == 1 else None


def _slice(feed: Mapping[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {k: (v[start:stop] if np.ndim(v) >= 1 else v) for k, v in feed.items()}


def _plan(per_sample: Mapping[str, int], budget: int, batch: int) -> _Plan:
    """Pack tensors into groups whose bytes for ``chunk`` samples fit ``budget``."""
    total = sum(per_sample.values())
    chunk = max(1, min(batch, budget // max(total, 1)))
    groups: list[list[str]] = [[]]
    used = 0
    for name, size in per_sample.items():
        if groups[-1] and used + size * chunk > budget:
            groups.append([])
            used = 0
        groups[-1].append(name)
        used += size * chunk
    return _Plan(chunk, groups, total)


def collect_statistics(
    model: onnx.ModelProto,
    tensor_names: Sequence[str],
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    num_bins: int = 2048,
    session_options: onnxruntime.SessionOptions | None = None,
    show_progress: bool = True,
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
) -> CalibrationStats:
    """Run ``model`` on every feed and stream the named tensors into :class:`CalibrationStats`.

    The model is copied and the requested intermediate tensors become graph outputs;
    graph inputs are read from the feeds and initializers from the model itself. The
    session runs on the CPU with graph optimizations disabled, so that intermediate
    tensor names survive; thread and logging settings come from ``session_options``
    (which is not modified).

    Peak memory is bounded by ``memory_budget_bytes`` (plus ORT's own working memory),
    whatever the model, batch or number of samples: the first feed is probed with one
    sample to learn each tensor's bytes per sample; then every feed runs in chunks of
    samples (within :func:`run_budget`: less for a small model), and when one sample's
    activations alone exceed the budget, the tensors are fetched in groups, one run per
    group. Outputs are folded into the histograms and dropped before the next run.
    """
    import onnx
    from onnx import numpy_helper

    stats = CalibrationStats(num_bins)
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    produced = {out for node in graph.node for out in node.output if out}
    unknown = [
        n
        for n in tensor_names
        if n not in produced and n not in initializers and n not in graph_inputs
    ]
    if unknown:
        raise ModelError(
            f"tensors {unknown} are not produced by any top-level node of the model",
            hint="calibrate only names of node outputs, graph inputs or initializers",
        )
    wanted = list(dict.fromkeys(tensor_names))
    for name in wanted:  # weights: one update, no inference needed
        if name in initializers:
            stats.update(name, numpy_helper.to_array(initializers[name]))
    from_feeds = [n for n in wanted if n in graph_inputs]
    from_session = [n for n in wanted if n in produced]

    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    existing = {out.name for out in augmented.graph.output}
    typed = {vi.name: vi for vi in list(augmented.graph.value_info) + list(augmented.graph.output)}
    for name in from_session:
        if name in existing:
            continue
        info = onnx.ValueInfoProto()
        if name in typed:
            info.CopyFrom(typed[name])
        else:
            info.name = name  # ORT infers the type of an untyped graph output
        augmented.graph.output.append(info)

    session = _make_session(augmented, session_options)
    required = {i.name for i in session.get_inputs()}
    count = 0
    plan: _Plan | None = None
    for feed in _with_progress(feeds, show_progress):
        if not isinstance(feed, Mapping):
            raise DataError(
                f"calibration feed #{count} is a {type(feed).__name__}, not a dict",
                hint="yield dicts of model input name to numpy array",
            )
        missing = required - set(feed)
        if missing:
            raise DataError(
                f"calibration feed #{count} lacks model inputs {sorted(missing)}",
                hint=f"the model takes inputs {sorted(required)}",
            )
        for name in from_feeds:
            stats.update(name, np.asarray(feed[name]))
        if from_session:
            run_feed = {k: np.asarray(v) for k, v in feed.items() if k in required}
            batch = _batch_of(run_feed)
            if plan is None:
                declared = _declared_bytes(typed, from_session)
                if len(declared) < len(from_session):  # symbolic dims: fix them to the feed's
                    sample = _slice(run_feed, 0, 1) if batch is not None else run_feed
                    declared.update(_inferred_bytes(model, from_session, sample))
                plan = _probe(
                    session, from_session, run_feed, batch, memory_budget_bytes, count, declared
                )
                per_run = run_budget(model, memory_budget_bytes)
                plan.chunk = min(plan.chunk, max(1, per_run // max(plan.per_sample, 1)))
            step = plan.chunk if batch is not None else 1
            for start in range(0, batch or 1, step):
                part = _slice(run_feed, start, start + step) if batch is not None else run_feed
                for group in plan.groups:
                    outputs = _run(session, group, part, count)
                    for name, value in zip(group, outputs):
                        stats.update(name, value)
                    del outputs
        count += 1
    if count == 0:
        raise DataError("the calibration data yielded no feeds", hint="pass at least one sample")
    return stats


def _run(
    session: onnxruntime.InferenceSession, names: list[str], feed: dict[str, np.ndarray], index: int
) -> list[np.ndarray]:
    try:
        return list(session.run(names, feed))
    except Exception as error:  # ORT raises its own untyped exceptions
        raise DataError(
            f"ONNX Runtime could not run calibration feed #{index}: {error}",
            hint="check the input names, shapes and dtypes against the model",
        ) from error


def _declared_bytes(typed: Mapping[str, Any], names: Sequence[str]) -> dict[str, int]:
    """Bytes of one sample of each tensor whose declared shape says so (a symbolic leading
    dimension counted as one sample); tensors of unknown shape or type are left out."""
    from onnx import helper

    sizes: dict[str, int] = {}
    for name in names:
        info = typed.get(name)
        if info is None or not info.type.HasField("tensor_type"):
            continue
        tensor = info.type.tensor_type
        if not tensor.elem_type or not tensor.HasField("shape"):
            continue
        dims = list(tensor.shape.dim)
        count = 1
        for position, dim in enumerate(dims):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                count *= int(dim.dim_value)
            elif position > 0:  # a symbolic inner dimension: unknown
                break
        else:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
            sizes[name] = count * itemsize
    return sizes


def _inferred_bytes(
    model: onnx.ModelProto, names: Sequence[str], sample: Mapping[str, np.ndarray]
) -> dict[str, int]:
    """Bytes of one sample of each tensor, by onnx's shape inference with the graph inputs
    fixed to ``sample``'s shapes: what a model with symbolic dimensions (an OCR model's
    width) leaves unknown. The inference runs on the graph alone: float weights enter as
    typed inputs (their shapes are what it needs), only integer constants keep their
    values (they compute shapes). Empty when inference fails (the probe then fetches
    those tensors one at a time, as it must without sizes)."""
    import onnx
    from onnx import TensorProto, helper

    source = model.graph
    graph = onnx.GraphProto()
    graph.node.extend(source.node)
    graph.output.extend(source.output)
    constant = {init.name for init in source.initializer}
    for given in source.input:
        if given.name in constant:
            continue
        info = graph.input.add()
        info.CopyFrom(given)
        if given.name in sample and info.type.HasField("tensor_type"):
            shape = info.type.tensor_type.shape
            shape.ClearField("dim")
            for size in np.shape(sample[given.name]):
                shape.dim.add().dim_value = int(size)
    for init in source.initializer:
        if init.data_type in (TensorProto.INT64, TensorProto.INT32):
            graph.initializer.append(init)
        else:
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    probe = onnx.ModelProto()
    probe.ir_version = model.ir_version
    probe.opset_import.extend(model.opset_import)
    probe.functions.extend(model.functions)
    probe.graph.CopyFrom(graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe)
    except Exception:  # onnx's own error types: sizes stay unknown
        return {}
    typed = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    return _declared_bytes(typed, names)


def _probe(
    session: onnxruntime.InferenceSession,
    names: list[str],
    feed: dict[str, np.ndarray],
    batch: int | None,
    budget: int,
    index: int,
    declared: Mapping[str, int] | None = None,
) -> _Plan:
    """Bytes per sample of each tensor, from one sample of the first feed.

    The tensors whose shapes are declared (a prepared model's, inferred) are fetched in
    groups that fit ``budget`` by those shapes, the others in groups that grow from one
    tensor while they fit by the sizes seen, so the probe stays within the budget in a
    few runs: one run per tensor cost ddddocr det (261 tensors, 416x416 input) 31 of its
    39 CPU seconds of calibration."""
    sample = _slice(feed, 0, 1) if batch is not None else feed
    declared = declared or {}
    known = {name: declared[name] for name in names if name in declared}
    sizes: dict[str, int] = {}

    def fetch(group: list[str]) -> None:
        outputs = _run(session, group, sample, index)
        for name, value in zip(group, outputs, strict=True):
            sizes[name] = int(np.asarray(value).nbytes)
        del outputs

    for group in _plan(known, budget, 1).groups if known else []:
        fetch(group)
    # Tensors of unknown shape: one first, then groups that double while twice the
    # largest tensor seen so far times the group fits the budget (PP-OCRv4 rec's 90
    # reshaped attention tensors took 90 runs, 1.2 s; now 7).
    unknown = [name for name in names if name not in declared]
    start, size = 0, 1
    while start < len(unknown):
        fetch(unknown[start : start + size])
        start += size
        largest = max(sizes.values(), default=0)
        size = max(1, min(2 * size, budget // max(2 * largest, 1)))
    return _plan(sizes, budget, batch or 1)


def _make_session(
    model: onnx.ModelProto, options: onnxruntime.SessionOptions | None
) -> onnxruntime.InferenceSession:
    from ..session import create_session

    return create_session(model, session_options=_unoptimized_copy(options), purpose="calibration")


# Plain SessionOptions settings carried over from the caller's options.
_COPIED_OPTIONS = (
    "intra_op_num_threads",
    "inter_op_num_threads",
    "execution_mode",
    "log_severity_level",
    "log_verbosity_level",
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "use_deterministic_compute",
)


def _unoptimized_copy(
    options: onnxruntime.SessionOptions | None,
) -> onnxruntime.SessionOptions:
    """Fresh session options with graph optimizations off (so tensor names survive), and
    ORT's intra-op threads not spinning.

    A copy, because callers reuse their options for evaluation sessions, which must
    stay optimized. Spinning threads wait for work by burning CPU: for a latency timing
    that is the point, for calibration it is CPU time for nothing. Off, the statistics
    are the same and calibration's CPU time falls (2 cores: ddddocr rec 2.8-3.1 -> 1.85
    s, det 10.2-11.7 -> 8.5 s, MTCNN at batch 32 1.7-1.9 -> 1.3 s), its wall time not
    longer.
    """
    import onnxruntime

    fresh = onnxruntime.SessionOptions()
    if options is not None:
        for name in _COPIED_OPTIONS:
            setattr(fresh, name, getattr(options, name))
    fresh.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    fresh.add_session_config_entry(SPINNING, "0")
    return fresh


#: ORT's session config key for intra-op threads spinning while they wait for work.
SPINNING = "session.intra_op.allow_spinning"


def _with_progress(feeds: Iterable[Any], enabled: bool) -> Iterable[Any]:
    """Yield ``feeds`` while showing a progress bar on an interactive terminal."""
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield from feeds
        return
    from rich.progress import Progress

    total = len(feeds) if isinstance(feeds, Sized) else None
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("calibrating", total=total)
        for feed in feeds:
            yield feed
            progress.advance(task)
