"""lpq-onnxrt's backend of core's latency search (:func:`lpq.latency.decide`).

A thin translation: candidates are built with the static plan's :class:`Builder`, timed
by an ORT timer (:mod:`.timing`, sequential, stopped once clear of the rules' edges),
blamed, looked up in the op latency table and profiled by :class:`.blame.Profiler`, and
judged for output error by :mod:`.fidelity`'s function. Core's variants are the formats
("qdq", "qoperator"), its alternative mode is dynamic int8, and :data:`RULES` holds the
numbers the decisions on real models were measured with. :class:`LatencyDecision` is
core's :class:`lpq.latency.Decision` in lpq-onnxrt's words (``fp32_ops``,
``quant_format``, ``dynamic_ops``), as the cache and the quantize result store it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from lpq.latency import Comparison, Decision, Rules
from lpq.latency.table import Verdict

from .timing import Timer, sequential

if TYPE_CHECKING:
    import onnx

    from ..model_io import ModelFile

#: A change must make the model this much faster (relative) to be kept; a change that
#: only gains fidelity (an op type back to fp32) is kept when it costs no more than this.
DEFAULT_MARGIN = 0.03
#: At most this many rounds of "ops the profiler blames -> fp32" per format.
BLAME_ROUNDS = 3
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
#: An op type the current model's profile predicts at least this much slower in fp32 (a
#: share of the model's time) is kept int8 without a build or a timing: twice the widest
#: band (``DYNAMIC_TIE``) any rule of the search could keep a change in.
PREDICTED_SLOWER = 2 * DYNAMIC_TIE

#: An op type whose move to fp32 can, by the current model's profile, make it faster by
#: at most this share of the margin stays int8 untimed (unless it cuts the output error):
#: half the margin, so a bound read twice too low still cannot win by the margin.
LEAST_GAIN = 0.5

#: The search's rules for ONNX Runtime: no clear-win shortcut (every plan is searched:
#: a plan 1.5x faster than fp32 still gains from its slow op types), three blame rounds,
#: no segments without a profiler, fp32 must beat the result by the margin, the tie and
#: fidelity constants above, and only each format's all-int8 model kept built (a search
#: builds dozens of candidates; large models must not pile up).
RULES = Rules(
    margin=DEFAULT_MARGIN,
    clear_win=None,
    blame_rounds=BLAME_ROUNDS,
    segments=False,
    final_margin=None,
    tie=DYNAMIC_TIE,
    fidelity_noise=FIDELITY_NOISE,
    fidelity_halves=FIDELITY_HALVES,
    fidelity_slack=FIDELITY_SLACK,
    fidelity_max_ops=FIDELITY_MAX_OPS,
    fidelity_gain=FIDELITY_GAIN,
    predicted_slower=PREDICTED_SLOWER,
    least_gain=LEAST_GAIN,
    keep_builds=False,
)


class Builder(Protocol):
    """Builds the model with ``fp32_ops`` left in fp32, the static ops in ``fmt``
    ("qdq"/"qoperator") and ``dynamic_ops`` quantized dynamically."""

    def __call__(
        self, fp32_ops: frozenset[str], fmt: str, dynamic_ops: frozenset[str] = ..., /
    ) -> onnx.ModelProto: ...


#: The quantized ops whose int8 cost exceeds their fp32 cost in a model (the profiler's).
Blame = Callable[["onnx.ModelProto", frozenset[str]], list[str]]
#: What the op latency table says about some ops (names) in a format, where they run int8
#: in a model with some ops fp32 (profiled there when the table lacks them); None: it
#: cannot decide (see :meth:`lpq_onnxrt.latency.blame.Profiler.verdict`).
TableVerdict = Callable[[Sequence[str], str, "onnx.ModelProto", frozenset[str]], "Verdict | None"]
#: How much slower a model would run with some ops (names) back in fp32, from its own
#: per-node profile (see :meth:`lpq_onnxrt.latency.blame.Profiler.slowdown`); and, of
#: the same type, at most how much faster (:meth:`~.blame.Profiler.gain_bound`).
Slowdown = Callable[[Sequence[str], "onnx.ModelProto", frozenset[str]], float]


class OrtBackend:
    """What :func:`lpq.latency.decide` asks, answered for one ONNX model.

    ``build``: the static plan's builder; ``fp32_model``: the float side of every
    comparison (a proto, or a :class:`~lpq_onnxrt.model_io.ModelFile` ORT opens
    itself); ``ops``: the static ops (name, op type); ``feed``: the measuring input;
    ``formats``: the formats allowed, the default first; ``timer``: an ORT timer (or a
    scripted one); ``dynamic``: static ops that may run dynamically quantized; ``error``:
    a model's output error against fp32; ``blame``, ``verdict``, ``slowdown``,
    ``gain_bound``: the profiler's (see :class:`.blame.Profiler`). Any of the last five
    may be None: that step does not run."""

    variant_name = "format"
    alternative_name = "dynamic int8"
    rules = RULES

    def __init__(
        self,
        build: Builder,
        fp32_model: onnx.ModelProto | ModelFile,
        ops: Sequence[tuple[str, str]],
        feed: Mapping[str, np.ndarray],
        *,
        formats: Sequence[str],
        timer: Timer,
        dynamic: Sequence[str] = (),
        error: Callable[[onnx.ModelProto], float] | None = None,
        blame: Blame | None = None,
        verdict: TableVerdict | None = None,
        slowdown: Slowdown | None = None,
        gain_bound: Slowdown | None = None,
    ) -> None:
        self._build, self.fp32_model, self._ops = build, fp32_model, list(ops)
        self.feed, self.formats, self.timer = dict(feed), tuple(formats), timer
        self.dynamic = list(dynamic)
        self.error = error
        self.blame = blame
        self.verdict = verdict
        self.slowdown = slowdown
        self.gain_bound = gain_bound
        self._compare = sequential(timer, self.feed)

    @contextlib.contextmanager
    def sessions_lent(self) -> Iterator[None]:
        """While the search runs: the output error of a model the timer has just timed
        runs in the timer's session (the same options) instead of a new one (ddddocr rec:
        three sessions fewer, two held at a time instead of three). The error of a model
        it has not timed (an op type the profile rules out, the fidelity step's single
        ops) makes its session after the timer drops all but the session last lent (the
        current model's): PP-OCRv4 det held a third session and peaked at 2.19 GB instead
        of 1.77. Nothing where the error or the timer cannot (a scripted one)."""
        lend = getattr(self.error, "lend", None)
        session_for = getattr(self.timer, "session_for", None)
        keep_only = getattr(self.timer, "keep_only", None)
        if not (callable(lend) and callable(session_for)):
            yield
            return
        last: list[onnx.ModelProto | None] = [None]

        def lender(model: onnx.ModelProto) -> Any | None:
            found = session_for(model)
            if found is not None:
                last[0] = model
            elif callable(keep_only):
                keep_only(last[0])
            return found

        lend(lender)
        # The timer times on the error's samples in turn and hands their outputs back:
        # the error of a model it has timed runs only the samples it did not.
        rows: Callable[[], list[Any]] | None = getattr(self.error, "timed_rows", None)
        observe = getattr(self.error, "observe", None)
        watch = getattr(self.timer, "watch", None)
        if not (callable(rows) and callable(observe) and callable(watch)):
            watch = None
        if watch is not None and rows is not None:
            watch(rows(), observe)
        try:
            yield
        finally:
            lend(None)
            if watch is not None:
                watch([], None)
                getattr(self.error, "forget_timed", lambda: None)()

    def ops(self) -> list[tuple[str, str]]:
        return self._ops

    def variants(self) -> tuple[str, ...]:
        return self.formats

    def alternatives(self, every: bool = False) -> list[str]:
        """Static ops that may run dynamically quantized: every one (``every``), else the
        MatMuls, tried all at once (the Q/K/V/FFN projections of a transformer; one
        DynamicQuantizeLinear serves three). Only where QDQ is allowed: dynamic ops beside
        QOperator static ones clash (both name their tensors *_quantized), so the rest
        stays static in QDQ (the first format whenever it is allowed)."""
        if "qdq" not in self.formats:
            return []
        if every:
            return list(self.dynamic)
        types = dict(self._ops)
        return [name for name in self.dynamic if types.get(name) == "MatMul"]

    def build(
        self, keep_float: frozenset[str], variant: str, alternative: frozenset[str]
    ) -> onnx.ModelProto | ModelFile:
        """The model with ``keep_float`` in fp32 (all of them: the fp32 model), the static
        ops in ``variant`` and ``alternative`` dynamic."""
        if keep_float == frozenset(name for name, _ in self._ops) and not alternative:
            return self.fp32_model
        if alternative:
            return self._build(keep_float, variant, alternative)
        return self._build(keep_float, variant)

    def compare(
        self, current: onnx.ModelProto, candidate: onnx.ModelProto, edges: Sequence[float]
    ) -> Comparison:
        return self._compare(current, candidate, edges)

    def runner(self, candidate: onnx.ModelProto) -> Callable[[], object]:
        """One run of ``candidate`` on the measuring input (core's protocol; the search
        times through :meth:`compare`)."""
        from ..session import create_session
        from .timing import measuring_options

        session = create_session(candidate, measuring_options({}))
        return lambda: session.run(None, self.feed)


@dataclass
class LatencyDecision(Decision):
    """Core's :class:`lpq.latency.Decision` in lpq-onnxrt's words; its JSON (the cache,
    the quantize result's ``latency``) names the ops kept fp32 ``fp32_ops``, the variant
    ``quant_format`` and the alternative ops ``dynamic_ops``."""

    @property
    def fp32_ops(self) -> list[str]:
        return self.keep_float

    @property
    def quant_format(self) -> str:
        return self.variant or "qdq"

    @property
    def dynamic_ops(self) -> list[str]:
        return self.alternative

    @classmethod
    def of(cls, decision: Decision) -> LatencyDecision:
        return cls(**{f.name: getattr(decision, f.name) for f in fields(decision)})

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        return {
            "fp32_ops": data.pop("keep_float"),
            "quant_format": data.pop("variant"),
            "dynamic_ops": data.pop("alternative"),
            **data,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, cached: bool = False) -> LatencyDecision:
        renamed = {
            **data,
            "keep_float": list(data["fp32_ops"]),
            "variant": str(data["quant_format"]),
            "alternative": list(data.get("dynamic_ops", [])),
        }
        decision = Decision.from_json(renamed, cached=cached)
        return cls.of(decision)
