"""``exhaustive``: every combination of per-op choices, in order, within the budget."""

from __future__ import annotations

import itertools

from .base import Candidate, Proposals, Strategy, TuningContext


class ExhaustiveStrategy(Strategy):
    name = "exhaustive"
    option_names: frozenset[str] | None = frozenset()
    #: Combinations proposed at once (independent, so they may run in parallel).
    batch = 4

    def propose(self, ctx: TuningContext) -> Proposals:
        space = ctx.space
        keys = space.tunable_ops
        per_op = [[*space.choices[k], space.fallback(k)] for k in keys]
        combos = (space.make(dict(zip(keys, combo))) for combo in itertools.product(*per_op))
        while chunk := list(itertools.islice(combos, self.batch)):
            yield [Candidate(cfg, "exhaustive") for cfg in chunk]
