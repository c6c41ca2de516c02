"""``bisect``: find the ops that cost accuracy by bisection (group testing).

Starting from the default config, the ops that run quantized are the suspects. The
strategy splits them into ``parts`` groups and falls back each group alone, all in one
batch (the trials are independent, so ``--workers`` runs them side by side). The group
whose fallback recovers the most accuracy is split again, until one op is left: that op
falls back for good. It repeats with the remaining suspects until the goal is met. An op
that costs accuracy is found in about ``parts * log_parts(n)`` trials, however many ops
the model has; the answer keeps every other op quantized.

When no group alone recovers more than ``min_gain`` (the damage is spread over the
groups, or ops only hurt together), the whole group falls back instead.

Options (``TuningCriterion(strategy_options={...})``):

* ``parts`` (int >= 2, default 2): groups per split; more groups, fewer rounds, more
  trials per round (useful with many workers).
* ``order`` (``"graph"`` or ``"random"``, default ``"graph"``): the order in which
  suspects are split. ``"graph"`` keeps neighbouring ops together; ``"random"`` shuffles
  them with ``ctx.rng`` (seeded by ``TuningCriterion.seed``), so a re-run walks the same
  path and resumes from its history.
* ``min_gain`` (number >= 0, default 0.0): accuracy, in metric units, a group's fallback
  must recover to be blamed.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import lpq

#: What a helper generator of a strategy is: it yields batches of candidates, receives
#: their records, and returns a value to ``yield from``.
Walk = Generator[list[lpq.Candidate], list[lpq.TrialRecord], Any]

ORDERS = ("graph", "random")


class BisectStrategy(lpq.Strategy):
    """Bisect the quantized ops to find the few that cost accuracy; fall those back."""

    name = "bisect"
    #: A probe that falls back half the model may already meet the goal; stopping there
    #: (``exit_policy="first_hit"``) would answer with half the model in fp32. The walk
    #: stops itself once a config it settled on meets the goal.
    honours_first_hit = False

    def __init__(
        self, parts: int = 2, order: str = "graph", min_gain: float = 0.0, **unknown: Any
    ) -> None:
        # factory(**kwargs) receives TuningCriterion.strategy_options as they are: check
        # them here, with a message that names the option and what is allowed.
        if unknown:
            raise lpq.ConfigError(
                f"strategy {self.name!r} has no option {', '.join(map(repr, sorted(unknown)))}",
                hint="its options are parts, order and min_gain (docs/writing-a-strategy.md)",
            )
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 2:
            raise lpq.ConfigError(
                f"strategy {self.name!r}: parts must be a whole number >= 2, not {parts!r}"
            )
        if order not in ORDERS:
            raise lpq.ConfigError(
                f"strategy {self.name!r}: order must be one of {', '.join(ORDERS)}, not {order!r}"
            )
        if isinstance(min_gain, bool) or not isinstance(min_gain, int | float) or min_gain < 0:
            raise lpq.ConfigError(
                f"strategy {self.name!r}: min_gain must be a number >= 0, not {min_gain!r}"
            )
        super().__init__(parts=parts, order=order, min_gain=min_gain)
        self.parts = parts
        self.order = order
        self.min_gain = float(min_gain)

    def propose(self, ctx: lpq.TuningContext) -> lpq.Proposals:
        space = ctx.space
        current = space.default()
        base = yield from lpq.one(current, "default")
        if base.status != "ok":  # failed, or "skipped": the default quantizes nothing
            return
        # Only ops the converted model really runs quantized can cost accuracy.
        suspects = lpq.runs_quantized(ctx, current, base)
        if self.order == "random":
            ctx.rng.shuffle(suspects)  # ctx.rng, never `random`: a re-run must resume
        while not ctx.meets_goal(base):
            if ctx.within_tolerance(base) or not suspects:
                # Accurate enough but not faster than fp32 (or nothing left to blame):
                # falling back more ops cannot make it faster.
                return
            blamed = yield from self.bisect(ctx, current, base, suspects)
            current = lpq.fall_back(space, current, blamed)
            suspects = [key for key in suspects if key not in blamed]
            # Usually a config the bisection tried already: the engine answers it with
            # that trial's record and spends no trial.
            base = yield from lpq.one(current, f"fall back {len(blamed)} op(s)")
            if base.status != "ok":
                # "skipped": every op would be fp32 (the baseline, no answer); "error":
                # the adaptor failed on it. Either way there is nothing to build on.
                return

    def bisect(
        self,
        ctx: lpq.TuningContext,
        cfg: lpq.TuneConfig,
        base: lpq.TrialRecord,
        suspects: list[lpq.OpKey],
    ) -> Walk:
        """The smallest group of ``suspects`` whose fallback from ``cfg`` recovers
        accuracy: one op, or a larger group when no part of it helps alone."""
        group = suspects
        while len(group) > 1:
            groups = split(group, self.parts)
            candidates = [
                lpq.Candidate(lpq.fall_back(ctx.space, cfg, part), f"bisect {len(group)} ops")
                for part in groups
            ]
            records = yield candidates  # one batch: may run in parallel
            # accuracy_gain is -inf for a record whose status is not "ok".
            gains = [lpq.accuracy_gain(ctx, record, base) for record in records]
            best = max(range(len(groups)), key=gains.__getitem__)
            if gains[best] <= self.min_gain:
                break  # no part helps alone: blame the whole group
            group = groups[best]
        return group


def split(items: list[lpq.OpKey], parts: int) -> list[list[lpq.OpKey]]:
    """``items`` in ``parts`` contiguous groups of near-equal size (fewer if too few)."""
    count = min(parts, len(items))
    size, extra = divmod(len(items), count)
    groups, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        groups.append(items[start:end])
        start = end
    return groups
