"""Which quantized ops to keep in float so that the model is never slower than fp32.

int8 is not faster everywhere: quantize/dequantize steps around small ops, a kernel
without a fast int8 path on this CPU (no VNNI), or a tiny model whose float kernels are
already memory-bound can make the int8 model slower than the float one. This module
*measures*, on the machine at hand, through a small per-framework :class:`Backend` that
builds a candidate with chosen ops in float and runs it once:

1. the plan (every op as asked) against the float model; a clear win (under
   ``clear_win`` of the fp32 time) is kept as is;
2. op types, most ops first: every op of the type back in float; kept when the model gets
   faster;
3. blame rounds: the ops the backend's profiler blames (:meth:`Backend.blame`, optional)
   or, without one, contiguous segments of the ops still quantized (halves, then
   quarters), back in float; kept when the model gets faster;
4. never slower than fp32: when the float model beats the result by more than the
   measured noise, every op goes back to float and the decision says
   ``slower_than_float``. With ``float_unless_faster`` it must be measured faster than
   fp32 (its paired ratio alone, whatever the noise) to be kept: the conservative rule on
   a loaded machine, where a wide noise would otherwise keep a result measured slower.

A change towards float is kept only when it wins by ``margin`` plus the noise of that
very measurement (:mod:`lpq.latency.timing`); a comparison that lands within the noise of
its threshold is timed again and pooled. On a loaded machine the noise grows and fewer
changes are made: the same model quantized twice gets the same plan. Every comparison is
recorded (:class:`Step`) with its times, so reports can show what was measured.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from ..errors import ConfigError
from .timing import Run, Timing, interleaved

C = TypeVar("C")

#: A change towards float must make the model this much faster (plus the noise) to be kept.
DEFAULT_MARGIN = 0.03
#: A plan taking less than this share of the fp32 time is kept without further search.
CLEAR_WIN = 0.8
#: Rounds of blamed ops (or of segments: halves, quarters, ...) after the op-type step.
BLAME_ROUNDS = 2
#: A comparison within its noise of the threshold is timed again, at most this often.
REMEASURE = 2


class Backend(Protocol[C]):
    """What the search asks a framework: the plan's ops, a candidate with some of them in
    float, and one inference of a candidate at the measuring input."""

    def ops(self) -> Sequence[tuple[str, str]]:
        """The plan's quantized ops, ``(name, op type)``, in graph order."""
        ...

    def build(self, keep_float: frozenset[str]) -> C:
        """The model with the ops ``keep_float`` in float (all of them: the float model)."""
        ...

    def runner(self, candidate: C) -> Run:
        """A callable that runs ``candidate`` once on the measuring input."""
        ...


@runtime_checkable
class Blamer(Protocol):
    """Optional backend method: the ops of ``candidate`` a profiler finds slower in int8
    than in float (lpq-onnxrt's ORT profiler does this)."""

    def blame(self, candidate: Any, keep_float: frozenset[str]) -> Sequence[str]: ...


#: Times candidates (label -> candidate) interleaved.
Timer = Callable[[Mapping[str, Any]], Timing]


@dataclass
class Step:
    """One comparison: ``change`` applied to the current plan, and what it measured."""

    change: str
    keep_float: list[str]
    before_ms: float
    after_ms: float
    #: after / before, the median of paired per-round ratios
    ratio: float
    noise: float
    kept: bool
    rounds: int


@dataclass
class Decision:
    """What the measurements decided, and the numbers behind it."""

    #: the plan's quantized ops (names), in graph order
    ops: list[str]
    #: those kept in float, in graph order
    keep_float: list[str]
    fp32_ms: float | None = None
    #: the plan as asked (every op quantized)
    planned_ms: float | None = None
    #: the result (``fp32_ms`` when every op went back to float)
    chosen_ms: float | None = None
    #: relative noise of the final comparison (result against fp32)
    noise: float = 0.0
    #: every quantized candidate measured slower than fp32: the result is the float model
    slower_than_float: bool = False
    #: the fastest quantized candidate's time when ``slower_than_float``
    best_quantized_ms: float | None = None
    #: fp32 time / result time and fp32 time / plan-as-asked time, each the median of
    #: per-round paired ratios (what the decisions used; more robust than ratios of the
    #: medians above on a busy machine). 1.0 when the result is the float model.
    speedup: float | None = None
    planned_speedup: float | None = None
    steps: list[Step] = field(default_factory=list)
    #: from the decision cache, not measured now
    cached: bool = False

    @property
    def quantized(self) -> list[str]:
        return [name for name in self.ops if name not in set(self.keep_float)]

    def summary(self) -> str:
        """One line for logs and reports."""
        kept = (
            "every op kept in float"
            if self.ops and len(self.keep_float) == len(self.ops)
            else f"{len(self.keep_float)} of {len(self.ops)} ops kept in float"
        )
        speed = (
            f"; {self.speedup:.2f}x fp32 ({self.chosen_ms:.3f} vs {self.fp32_ms:.3f} ms, "
            f"noise {self.noise:.0%}; the plan as asked: {self.planned_speedup:.2f}x)"
            if self.speedup is not None and self.planned_speedup is not None
            else ""
        )
        return f"latency-aware: {kept}{speed}{' (cached)' if self.cached else ''}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("cached")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, cached: bool = False) -> Decision:
        fields = {k: v for k, v in data.items() if k != "steps"}
        steps = [Step(**step) for step in data.get("steps", [])]
        return cls(**fields, steps=steps, cached=cached)


def enabled(options: Mapping[str, Any]) -> bool:
    """The ``latency_aware`` option: true/false (also "on"/"off", "yes"/"no", 1/0);
    absent: off (``lpq.quantize`` turns it on for adaptors that declare the recipe)."""
    value = options.get("latency_aware", False)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("on", "true", "yes", "1", "auto"):
            return True
        if lowered in ("off", "false", "no", "0"):
            return False
    elif isinstance(value, bool | int) and value in (0, 1):
        return bool(value)
    raise ConfigError(
        f"latency_aware must be true or false, not {value!r}", hint="use true or false"
    )


def runner_timer(backend: Backend[Any], **timing_options: Any) -> Timer:
    """The default timer: :func:`lpq.latency.timing.interleaved` over the backend's
    runners (``timing_options``: its keyword arguments, e.g. ``budget_s``, ``seed``)."""

    def timer(candidates: Mapping[str, Any]) -> Timing:
        runs = {label: backend.runner(candidate) for label, candidate in candidates.items()}
        return interleaved(runs, **timing_options)

    return timer


def decide(
    backend: Backend[Any],
    *,
    timer: Timer | None = None,
    margin: float = DEFAULT_MARGIN,
    clear_win: float = CLEAR_WIN,
    blame_rounds: int = BLAME_ROUNDS,
    log: Callable[[str], None] | None = None,
    float_unless_faster: bool = False,
) -> Decision:
    """Measure and decide which of ``backend.ops()`` stay in float (see the module doc)."""
    ops = list(backend.ops())
    names = [name for name, _ in ops]
    every = frozenset(names)
    decision = Decision(ops=names, keep_float=[])
    if not ops:
        return decision
    timer = timer or runner_timer(backend)
    built: dict[Hashable, Any] = {}
    tried: set[frozenset[str]] = set()

    def get(keep: frozenset[str]) -> Any:
        if keep not in built:
            built[keep] = backend.build(keep)
        return built[keep]

    def compare(current: frozenset[str], trial: frozenset[str], what: str, need: float) -> Step:
        """Time ``trial`` against ``current``; kept when faster by ``need`` + noise."""
        tried.add(trial)
        candidates = {"current": get(current), "candidate": get(trial)}
        timing = timer(candidates)
        for _ in range(REMEASURE):
            ratio, noise = (
                timing.ratio("candidate", "current"),
                timing.noise("candidate", "current"),
            )
            if abs(ratio - (1.0 - need)) > noise:
                break
            timing = timing.merged(timer(candidates))  # too close to call: pool more rounds
        ratio, noise = timing.ratio("candidate", "current"), timing.noise("candidate", "current")
        step = Step(
            change=what,
            keep_float=[n for n in names if n in trial],
            before_ms=round(timing.ms("current"), 5),
            after_ms=round(timing.ms("candidate"), 5),
            ratio=round(ratio, 4),
            noise=round(noise, 4),
            kept=ratio < 1.0 - need - noise,
            rounds=timing.rounds,
        )
        decision.steps.append(step)
        if log is not None:
            log(
                f"latency: {what}: {step.before_ms:.3f} -> {step.after_ms:.3f} ms "
                f"(x{ratio:.3f}, noise {noise:.1%}): {'kept' if step.kept else 'rejected'}"
            )
        return step

    keep: frozenset[str] = frozenset()
    first = compare(keep, every, "plan as asked -> every op float", 0.0)
    decision.planned_ms, decision.fp32_ms = first.before_ms, first.after_ms
    final = first
    # plan / fp32 is 1 / first.ratio: under clear_win even at the edge of the noise,
    # nothing is worth searching.
    if (1.0 + first.noise) / first.ratio >= clear_win:
        by_type: dict[str, list[str]] = {}
        for name, op_type in ops:
            by_type.setdefault(op_type, []).append(name)
        for op_type, group in sorted(by_type.items(), key=lambda item: -len(item[1])):
            trial = keep | frozenset(group)
            if trial not in (keep, every):
                what = f"{op_type} ({len(group)} ops) -> float"
                if compare(keep, trial, what, margin).kept:
                    keep = trial
        keep = _blame_rounds(backend, get, compare, names, keep, blame_rounds, margin, tried)
        if keep:
            final = compare(keep, every, "result -> every op float", 0.0)
            decision.fp32_ms = final.after_ms
    decision.noise = final.noise
    # fp32 beats the best quantized plan by more than the noise (or at all, when asked)
    to_float = final.kept or (float_unless_faster and final.ratio <= 1.0)
    if to_float:
        decision.slower_than_float = True
        decision.best_quantized_ms = final.before_ms
        keep = every
    decision.chosen_ms = final.after_ms if to_float else final.before_ms
    decision.speedup = 1.0 if to_float else round(final.ratio, 4)
    decision.planned_speedup = round(first.ratio, 4)
    decision.keep_float = [name for name in names if name in keep]
    return decision


def _blame_rounds(
    backend: Backend[Any],
    get: Callable[[frozenset[str]], Any],
    compare: Callable[[frozenset[str], frozenset[str], str, float], Step],
    names: list[str],
    keep: frozenset[str],
    rounds: int,
    margin: float,
    tried: set[frozenset[str]],
) -> frozenset[str]:
    """Step 3: blamed ops (or segments of the ops still quantized) back in float."""
    every = frozenset(names)
    for depth in range(1, rounds + 1):
        if isinstance(backend, Blamer):
            blamed = frozenset(backend.blame(get(keep), keep)) - keep
            groups = [sorted(blamed)] if blamed else []
            label = "ops the profiler blames"
        else:
            left = [name for name in names if name not in keep]
            groups = _segments(left, 2**depth)
            label = "segment"
        for group in groups:
            trial = keep | frozenset(group)
            if trial in (keep, every) or trial in tried:
                continue
            span = f"{group[0]}..{group[-1]}" if len(group) > 1 else group[0]
            if compare(keep, trial, f"{label} {span} ({len(group)} ops) -> float", margin).kept:
                keep = trial
        if not groups:
            break
    return keep


def _segments(names: list[str], parts: int) -> list[list[str]]:
    """``names`` cut into up to ``parts`` contiguous, nearly equal pieces (none when there
    are fewer than two names: one op alone was already tried with its type or not worth
    a measurement of its own)."""
    if len(names) < 2:
        return []
    parts = min(parts, len(names))
    size, extra = divmod(len(names), parts)
    pieces, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        pieces.append(names[start:end])
        start = end
    return pieces


def announce(decision: Decision, framework: str, logger: Any) -> None:
    """Log the decision's summary; when every quantized plan was slower than fp32, also
    warn (:class:`lpq.LpqWarning`): the result runs every op in float."""
    import warnings

    from ..errors import LpqWarning

    logger.info("%s: %s", framework, decision.summary())
    if decision.slower_than_float:
        best = decision.best_quantized_ms or 0.0
        fp32 = decision.fp32_ms or 0.0
        warnings.warn(
            f"{framework}: int8 is slower than fp32 on this machine for every plan tried "
            f"(best {best:.3f} ms against {fp32:.3f} ms fp32): every op was kept in float. "
            "Pass latency_aware=False (lpq quantize --no-latency-aware) to get the int8 "
            "model anyway, e.g. for another target device",
            LpqWarning,
            stacklevel=3,
        )
