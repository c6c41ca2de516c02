"""Latency-aware quantization: keep in fp32 what int8 makes slower on this machine.

int8 is not faster everywhere. Small depthwise convs, tiny MatMuls and elementwise ops
between float neighbours pay more for QuantizeLinear/DequantizeLinear than they save, and
whether a kernel wins depends on the CPU (VNNI or not), the thread count and the batch.
Rather than guess, this module *measures* on the machine at hand, in context:

1. format: the full int8 plan in QDQ and in QOperator (when the user did not pick one);
   the faster one is kept;
2. op types, most expensive first: the plan with every op of that type in fp32 against the
   current plan; the type goes back to fp32 when the model gets faster;
3. single ops the profiler blames (their int8 node plus the Q/DQ nodes around them cost
   more than the fp32 node did): tried together, kept in fp32 when the model gets faster;
4. never slower than fp32: if the fp32 model beats the result, every op stays fp32.

Every comparison times whole models, interleaved (a run of each, in turn, many times) and
compares medians, so drift on a shared machine hits both sides alike; a change is accepted
only when it wins by ``margin``. The decisions (ops kept in fp32, the format) are cached on
disk per model, machine, input shape, thread count and requested plan, so a tuning run and
a later ``lpq quantize`` of the same model pay once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import lpq

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

_CACHE_FORMAT = "lpq-onnxrt-latency/1"
#: A change must make the model this much faster (relative) to be kept.
DEFAULT_MARGIN = 0.03

#: builds the model with these ops (names) left in fp32, in this format ("qdq"/"qoperator").
Builder = Callable[[frozenset[str], str], "onnx.ModelProto"]
#: median seconds per run of each model (by label), timed interleaved on ``feed``.
Timer = Callable[[Mapping[str, "onnx.ModelProto"], Mapping[str, np.ndarray]], dict[str, float]]


@dataclass
class LatencyDecision:
    """What the measurements decided, and the numbers behind it."""

    fp32_ops: list[str]
    quant_format: str
    #: human-readable log of each comparison: (what, seconds before, seconds after, kept)
    steps: list[dict[str, Any]] = field(default_factory=list)
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"fp32_ops": self.fp32_ops, "quant_format": self.quant_format, "steps": self.steps}


def enabled(options: Mapping[str, Any]) -> bool:
    """The ``latency_aware`` option (default off: a tuning trial must get the ops its
    tune_cfg asks for; ``lpq quantize`` and the ``onnxrt-cpu`` backend profile turn it on)."""
    value = options.get("latency_aware", False)
    if isinstance(value, str):
        value = value.strip().lower()
        if value in ("off", "false", "no", "0"):
            return False
        if value in ("on", "true", "yes", "1", "auto"):
            return True
        raise lpq.ConfigError(
            f"latency_aware must be true or false, not {value!r}", hint="use true or false"
        )
    return bool(value)


def machine_key(options: Mapping[str, Any]) -> dict[str, Any]:
    """What makes timings of one machine comparable: CPU, cores, ORT, threads, provider."""
    import onnxruntime

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "onnxruntime": onnxruntime.__version__,
        "threads": measuring_options(options).get("intra_op_num_threads", options.get("threads")),
        "providers": list(options.get("providers") or ["CPUExecutionProvider"]),
    }


def cache_dir(options: Mapping[str, Any]) -> Path:
    """``options['latency_cache_dir']``, else ``$LPQ_CACHE_DIR/onnxrt-latency``, else
    ``~/.cache/lpq/onnxrt-latency``."""
    chosen = options.get("latency_cache_dir")
    if chosen:
        return Path(chosen)
    root = os.environ.get("LPQ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lpq"
    )
    return Path(root) / "onnxrt-latency"


def cache_key(
    model_key: str, feed: Mapping[str, np.ndarray], plan: Any, options: Mapping[str, Any]
) -> str:
    source = json.dumps(
        {
            "model": model_key,
            "shapes": {name: list(np.shape(value)) for name, value in sorted(feed.items())},
            "plan": plan,
            "machine": machine_key(options),
            "format": options.get("quant_format", "auto"),
            "margin": float(options.get("latency_margin", DEFAULT_MARGIN)),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(source.encode()).hexdigest()[:24]


def load_cached(folder: Path, key: str) -> LatencyDecision | None:
    path = folder / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _CACHE_FORMAT:
            return None
        return LatencyDecision(
            list(data["fp32_ops"]), str(data["quant_format"]), list(data["steps"]), cached=True
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(folder: Path, key: str, decision: LatencyDecision) -> None:
    try:
        lpq.write_json(folder / f"{key}.json", {"format": _CACHE_FORMAT, **decision.to_json()})
    except OSError as exc:  # a read-only cache must not fail quantization
        log.warning("cannot write the latency cache in %s (%s)", folder, exc)


# --------------------------------------------------------------------------- timing


def measuring_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Session options for measurements: the user's, with one intra-op thread unless the
    user chose a thread count (on a shared machine, timings with every core are noise;
    which kernel wins rarely depends on the thread count)."""
    chosen = dict(options)
    if chosen.get("intra_op_num_threads") is None and chosen.get("threads") is None:
        chosen["intra_op_num_threads"] = 1
    return chosen


def ort_timer(options: Mapping[str, Any], budget_s: float = 1.0, min_runs: int = 7) -> Timer:
    """Time ONNX Runtime sessions (with :func:`measuring_options`), interleaved."""
    options = measuring_options(options)

    def measure(
        models: Mapping[str, onnx.ModelProto], feed: Mapping[str, np.ndarray]
    ) -> dict[str, float]:
        from .session import create_session

        sessions = {label: create_session(proto, options) for label, proto in models.items()}
        feeds = dict(feed)
        for session in sessions.values():  # warm-up: first runs allocate and pack weights
            session.run(None, feeds)
            session.run(None, feeds)
        times: dict[str, list[float]] = {label: [] for label in sessions}
        deadline = time.perf_counter() + budget_s * len(sessions)
        runs = 0
        while runs < min_runs or (time.perf_counter() < deadline and runs < 200):
            for label, session in sessions.items():
                start = time.perf_counter()
                session.run(None, feeds)
                times[label].append(time.perf_counter() - start)
            runs += 1
        return {label: statistics.median(values) for label, values in times.items()}

    return measure


# --------------------------------------------------------------------------- search


def decide(
    build: Builder,
    fp32_model: onnx.ModelProto,
    ops: Sequence[tuple[str, str]],
    feed: Mapping[str, np.ndarray],
    *,
    formats: Sequence[str],
    timer: Timer,
    margin: float = DEFAULT_MARGIN,
    blame: Callable[[onnx.ModelProto, frozenset[str]], list[str]] | None = None,
) -> LatencyDecision:
    """Measure and decide which of ``ops`` (name, op type) stay fp32; see the module doc."""
    steps: list[dict[str, Any]] = []

    def better(current: onnx.ModelProto, candidate: onnx.ModelProto, what: str) -> bool:
        times = timer({"current": current, "candidate": candidate}, feed)
        kept = times["candidate"] < times["current"] * (1.0 - margin)
        steps.append(
            {
                "change": what,
                "before_ms": round(times["current"] * 1e3, 4),
                "after_ms": round(times["candidate"] * 1e3, 4),
                "kept": kept,
            }
        )
        log.info(
            "latency: %s: %.3f -> %.3f ms (%s)",
            what,
            times["current"] * 1e3,
            times["candidate"] * 1e3,
            "kept" if kept else "rejected",
        )
        return kept

    fp32: frozenset[str] = frozenset()
    fmt = formats[0]
    current = build(fp32, fmt)
    for other in formats[1:]:
        candidate = build(fp32, other)
        if better(current, candidate, f"format {fmt} -> {other}"):
            fmt, current = other, candidate

    by_type: dict[str, list[str]] = {}
    for name, op_type in ops:
        by_type.setdefault(op_type, []).append(name)
    # Types with many ops first: they move the total most and are measured most reliably.
    for op_type, names in sorted(by_type.items(), key=lambda item: -len(item[1])):
        trial = fp32 | frozenset(names)
        if len(trial) == len(ops):
            continue  # all-fp32 is checked last, against the fp32 model itself
        candidate = build(trial, fmt)
        if better(current, candidate, f"{op_type} ({len(names)} ops) -> fp32"):
            fp32, current = trial, candidate

    if blame is not None:
        suspects = [n for n in blame(current, fp32) if n not in fp32]
        if suspects and len(fp32) + len(suspects) < len(ops):
            trial = fp32 | frozenset(suspects)
            candidate = build(trial, fmt)
            if better(current, candidate, f"{len(suspects)} ops slower in int8 -> fp32"):
                fp32, current = trial, candidate

    if better(current, fp32_model, "every op -> fp32"):
        fp32 = frozenset(name for name, _ in ops)
    order = [name for name, _ in ops if name in fp32]
    return LatencyDecision(order, fmt, steps)


# --------------------------------------------------------------------------- profiling


def profile_blame(
    options: Mapping[str, Any],
    feed: Mapping[str, np.ndarray],
    fp32_model: onnx.ModelProto,
    ops: Sequence[str],
) -> Callable[[onnx.ModelProto, frozenset[str]], list[str]]:
    """A ``blame`` function: quantized ops whose int8 cost exceeds their fp32 cost.

    ORT's profiler gives each node of the optimized graph its time. An op's int8 cost is
    the time of the nodes named after it (``QLinearConv`` keeps the op's name as prefix)
    plus a share of the QuantizeLinear / DequantizeLinear nodes next to them; its fp32
    cost is the time of its nodes in the fp32 model (matched by name or output tensor).
    """
    options = measuring_options(options)
    fp32_times = _node_times(fp32_model, options, feed)
    by_output = {out: node.name for node in fp32_model.graph.node for out in node.output}

    def blame(model: onnx.ModelProto, fp32_ops: frozenset[str]) -> list[str]:
        quantized = [name for name in ops if name not in fp32_ops]
        int8_times = _node_times(model, options, feed)
        int8_cost = _attribute(int8_times, quantized, by_output, with_qdq=True)
        fp32_cost = _attribute(fp32_times, quantized, by_output, with_qdq=False)
        return [
            name
            for name in quantized
            if int8_cost.get(name, 0.0) > 1.1 * fp32_cost.get(name, 0.0) + 1e-3
        ]

    return blame


@dataclass
class _Timed:
    op_type: str
    inputs: list[str]
    outputs: list[str]
    ms: float


def _node_times(
    model: onnx.ModelProto,
    options: Mapping[str, Any],
    feed: Mapping[str, np.ndarray],
    runs: int = 10,
) -> dict[str, _Timed]:
    """Per-node time (ms per run) of the ORT-optimized ``model``, with its wiring."""
    import tempfile

    import onnx

    from .session import create_session

    with tempfile.TemporaryDirectory(prefix="lpq-profile-") as tmp:
        optimized = os.path.join(tmp, "optimized.onnx")
        session = create_session(
            model,
            {
                **options,
                "enable_profiling": os.path.join(tmp, "profile"),
                "optimized_model_filepath": optimized,
            },
        )
        for _ in range(runs + 2):
            session.run(None, dict(feed))
        profile = session.end_profiling()
        events = json.loads(Path(profile).read_text(encoding="utf-8"))
        graph = onnx.load(optimized, load_external_data=False).graph
    wiring = {node.name: node for node in graph.node}
    times: dict[str, _Timed] = {}
    skip = 2  # the first runs are warm-up
    seen_runs: dict[str, int] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        seen_runs[name] = seen_runs.get(name, 0) + 1
        if seen_runs[name] <= skip:
            continue
        node = wiring.get(name)
        entry = times.get(name)
        if entry is None:
            entry = times[name] = _Timed(
                event["args"].get("op_name", ""),
                list(node.input) if node is not None else [],
                list(node.output) if node is not None else [],
                0.0,
            )
        entry.ms += event["dur"] / 1000.0 / runs
    return times


_QDQ = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def _owner(
    node_name: str, timed: _Timed, names: Sequence[str], by_output: Mapping[str, str]
) -> str | None:
    """The op (by fp32 name) an optimized node computes: its name, a prefix of its name,
    or the op whose output tensor it writes (ORT names NCHWc convs after their output)."""
    from .precision import owner_of

    best = owner_of(node_name, names)
    if best is not None:
        return best
    wanted = set(names)
    for tensor in (*timed.outputs, node_name.removesuffix("_nchwc")):
        owner = by_output.get(tensor.removesuffix("_quantized"))
        if owner in wanted:
            return owner
    return None


def _attribute(
    times: Mapping[str, _Timed],
    ops: Sequence[str],
    by_output: Mapping[str, str],
    *,
    with_qdq: bool,
) -> dict[str, float]:
    """Per op: the time of its own nodes, plus (int8) its share of adjacent Q/DQ nodes.

    ``by_output`` maps fp32 tensor names to the op that writes them.
    """
    cost: dict[str, float] = dict.fromkeys(ops, 0.0)
    owners: dict[str, str | None] = {}
    for name, timed in times.items():
        if timed.op_type in _QDQ:
            owners[name] = None
            continue
        owner = _owner(name, timed, ops, by_output)
        owners[name] = owner
        if owner is not None:
            cost[owner] += timed.ms
    if not with_qdq:
        return cost
    producer = {out: name for name, t in times.items() for out in t.outputs}
    consumers: dict[str, list[str]] = {}
    for name, timed in times.items():
        for tensor in timed.inputs:
            consumers.setdefault(tensor, []).append(name)
    for timed in times.values():
        if timed.op_type not in _QDQ:
            continue
        near = {owners.get(n) for t in timed.outputs for n in consumers.get(t, [])}
        near |= {owners.get(producer.get(t, "")) for t in timed.inputs}
        near.discard(None)
        for owner in near:
            if owner is not None:
                cost[owner] += timed.ms / len(near)
    return cost
