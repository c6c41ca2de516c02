"""``mse``: rank ops by inspected quantization error (or, without inspection, by the
output effect of falling back each alone) and fall back the worst first, one at a
time."""

from __future__ import annotations

from .base import Proposals, Strategy, TuningContext, fall_back, one, probe_op_by_op, ranked


class MSEStrategy(Strategy):
    name = "mse"
    option_names: frozenset[str] | None = frozenset()

    def propose(self, ctx: TuningContext) -> Proposals:
        current = ctx.space.default()
        if ctx.meets_goal((yield from one(current, "default"))):
            return
        scores = ctx.op_sensitivity(current)
        if scores is None:
            scores = yield from probe_op_by_op(ctx, current, "fallback op by op")
        for key in ranked(ctx, current, scores):
            current = fall_back(ctx.space, current, [key])
            if ctx.meets_goal((yield from one(current, "fallback by error"))):
                return
