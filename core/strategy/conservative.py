"""``conservative``: start from fp32, quantize op types (then ops) one at a time, keeping
each only while the goal holds. Never stops at the first hit: its first hit is nearly
fp32."""

from __future__ import annotations

from .base import Proposals, Strategy, TuningContext, one, requantize


class ConservativeStrategy(Strategy):
    name = "conservative"
    option_names: frozenset[str] | None = frozenset()
    honours_first_hit = False

    def propose(self, ctx: TuningContext) -> Proposals:
        space = ctx.space
        current = space.all_fallback()
        by_count = sorted(
            space.op_types(), key=lambda t: -sum(1 for k in space.tunable_ops if k[1] == t)
        )
        for op_type in by_count:
            keys = [k for k in space.tunable_ops if k[1] == op_type]
            candidate = requantize(space, current, keys, space.default())
            if ctx.meets_goal((yield from one(candidate, f"quantize {op_type}"))):
                current = candidate
                continue
            for key in keys:
                candidate = requantize(space, current, [key], space.default())
                if ctx.meets_goal((yield from one(candidate, f"quantize {key[0]}"))):
                    current = candidate
