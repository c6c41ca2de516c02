"""``basic``: Intel Neural Compressor's classic walk.

Default config; op-type-wise tuning of algorithm/scheme/granularity (keep what helps);
fall back each op alone to measure its impact on the output; then accumulate fallbacks
in order of that impact until the goal is met.
"""

from __future__ import annotations

from .base import (
    Candidate,
    Proposals,
    Strategy,
    TuningContext,
    fall_back,
    improves,
    one,
    probe_op_by_op,
)


class BasicStrategy(Strategy):
    name = "basic"
    option_names = frozenset({"variants_per_op_type"})

    def propose(self, ctx: TuningContext) -> Proposals:
        space = ctx.space
        current = space.default()
        best = yield from one(current, "default")
        if ctx.meets_goal(best):
            return
        limit = int(self.options.get("variants_per_op_type", 4))
        for op_type in space.op_types():
            keys = [k for k in space.tunable_ops if k[1] == op_type]
            variants = space.op_type_variants(op_type)[1 : limit + 1]
            candidates = [current.with_ops(dict.fromkeys(keys, v)) for v in variants]
            records = yield [Candidate(c, f"op-type {op_type}") for c in candidates]
            for candidate, record in zip(candidates, records):
                if improves(ctx, record, best):
                    best, current = record, candidate
            if ctx.meets_goal(best):
                return
        impact = yield from probe_op_by_op(ctx, current, "fallback op by op")
        for key in sorted(impact, key=lambda key: -impact[key]):
            current = fall_back(space, current, [key])
            if ctx.meets_goal((yield from one(current, "accumulated fallback"))):
                return
