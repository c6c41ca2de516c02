"""The built-in strategies. Each is registered through ``lpq_register_strategies``.

* ``auto`` (default): default config; if it misses the goal, rank ops by measured
  quantization error (from ``lpq_inspect_tensor``, no trial spent) and fall back the
  most harmful ops in growing groups, so concentrated damage is found in a few trials;
  with ``exit_policy="best"`` it then narrows the fallback set and re-quantizes ops
  greedily to improve the objective.
* ``basic``: default; op-type-wise tuning of algorithm/scheme/granularity; fallback op by
  op to measure each op's impact; accumulated fallback in order of that impact.
* ``conservative``: start from fp32 and quantize op types (then ops) one at a time,
  keeping each only while the goal holds. Never stops at the first hit.
* ``mse``: rank ops by inspected error and fall back the worst first, one at a time.
* ``exhaustive``: every combination, in order, within the trial budget.
* ``random``: random per-op choices (seeded), within the trial budget.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from ..tune_config import OpKey, TuneConfig
from .base import Strategy, TuningContext, fall_back, rank_by_sensitivity, requantize

if TYPE_CHECKING:
    from ..trial import TrialRecord


def _probe_op_by_op(ctx: TuningContext, cfg: TuneConfig, stage: str) -> dict[OpKey, float]:
    """Fall back each op alone; an op's impact is the accuracy its fallback recovers."""
    base = ctx.evaluate(cfg, stage)
    impact: dict[OpKey, float] = {}
    for key in ctx.space.tunable_ops:
        if not cfg.ops[key].quantized:
            continue
        record = ctx.evaluate(fall_back(ctx.space, cfg, [key]), stage)
        gain = record.accuracy - base.accuracy
        impact[key] = gain if ctx.higher_is_better else -gain
        if math.isnan(impact[key]):
            impact[key] = -math.inf
    return impact


def _accumulate(ctx: TuningContext, cfg: TuneConfig, order: list[OpKey], stage: str) -> None:
    current = cfg
    for key in order:
        current = fall_back(ctx.space, current, [key])
        if ctx.meets_goal(ctx.evaluate(current, stage)):
            return


class BasicStrategy(Strategy):
    name = "basic"

    def traverse(self, ctx: TuningContext) -> None:
        space = ctx.space
        current = space.default()
        best = ctx.evaluate(current, "default")
        if ctx.meets_goal(best):
            return
        # Op-type-wise: try each op type's other options, keep what helps.
        limit = int(self.options.get("variants_per_op_type", 4))
        for op_type in space.op_types():
            for variant in space.op_type_variants(op_type)[1 : limit + 1]:
                keys = [k for k in space.tunable_ops if k[1] == op_type]
                candidate = current.with_ops({k: variant for k in keys})
                record = ctx.evaluate(candidate, f"op-type {op_type}")
                if _improves(ctx, record, best):
                    best, current = record, candidate
                    if ctx.meets_goal(record):
                        return
        impact = _probe_op_by_op(ctx, current, "fallback op by op")
        order = sorted(impact, key=lambda key: -impact[key])
        _accumulate(ctx, current, order, "accumulated fallback")


def _improves(ctx: TuningContext, record: TrialRecord, best: TrialRecord) -> bool:
    if record.status != "ok":
        return False
    if ctx.higher_is_better:
        return record.accuracy > best.accuracy
    return record.accuracy < best.accuracy


class ConservativeStrategy(Strategy):
    name = "conservative"
    honours_first_hit = False

    def traverse(self, ctx: TuningContext) -> None:
        space = ctx.space
        current = space.all_fallback()
        by_count = sorted(
            space.op_types(), key=lambda t: -sum(1 for k in space.tunable_ops if k[1] == t)
        )
        for op_type in by_count:
            keys = [k for k in space.tunable_ops if k[1] == op_type]
            candidate = requantize(space, current, keys, space.default())
            if ctx.meets_goal(ctx.evaluate(candidate, f"quantize {op_type}")):
                current = candidate
                continue
            for key in keys:
                candidate = requantize(space, current, [key], space.default())
                if ctx.meets_goal(ctx.evaluate(candidate, f"quantize {key[0]}")):
                    current = candidate


class MSEStrategy(Strategy):
    name = "mse"

    def traverse(self, ctx: TuningContext) -> None:
        current = ctx.space.default()
        if ctx.meets_goal(ctx.evaluate(current, "default")):
            return
        order = rank_by_sensitivity(
            ctx, current, lambda: _probe_op_by_op(ctx, current, "fallback op by op")
        )
        _accumulate(ctx, current, order, "fallback by error")


class AutoStrategy(Strategy):
    name = "auto"

    def traverse(self, ctx: TuningContext) -> None:
        space = ctx.space
        default = space.default()
        record = ctx.evaluate(default, "default")
        order = [k for k in space.tunable_ops if default.ops[k].quantized]
        hit = 0
        if not ctx.meets_goal(record):
            order = rank_by_sensitivity(
                ctx, default, lambda: _probe_op_by_op(ctx, default, "probe op by op")
            )
            grown = self._grow_fallback(ctx, default, order)
            if grown is None:
                return
            hit = grown
        # Budget left (exit policy "best"): fewer fallbacks, then better options.
        hit = self._narrow(ctx, default, order, hit)
        self._requantize_greedily(ctx, fall_back(space, default, order[:hit]), order[:hit])
        self._try_variants(ctx)

    @staticmethod
    def _group_sizes(total: int) -> list[int]:
        sizes, k = [], 1
        while k < total:
            sizes.append(k)
            k = max(k + 1, int(k * 1.5))
        sizes.append(total)
        return sizes

    def _grow_fallback(
        self, ctx: TuningContext, default: TuneConfig, order: list[OpKey]
    ) -> int | None:
        for size in self._group_sizes(len(order)):
            cfg = fall_back(ctx.space, default, order[:size])
            if ctx.meets_goal(ctx.evaluate(cfg, f"fallback top {size}")):
                return size
        return None

    def _narrow(self, ctx: TuningContext, default: TuneConfig, order: list[OpKey], hit: int) -> int:
        sizes = self._group_sizes(len(order))
        lower = max([s for s in sizes if s < hit], default=0)
        while hit - lower > 1:
            middle = (lower + hit) // 2
            cfg = fall_back(ctx.space, default, order[:middle])
            if ctx.meets_goal(ctx.evaluate(cfg, f"narrow to top {middle}")):
                hit = middle
            else:
                lower = middle
        return hit

    def _requantize_greedily(
        self, ctx: TuningContext, cfg: TuneConfig, fallen: list[OpKey]
    ) -> None:
        reference = ctx.space.default()
        for key in reversed(fallen):
            candidate = requantize(ctx.space, cfg, [key], reference)
            if ctx.meets_goal(ctx.evaluate(candidate, f"requantize {key[0]}")):
                cfg = candidate

    def _try_variants(self, ctx: TuningContext) -> None:
        best = ctx.best
        if best is None or best.tune_cfg is None:
            return
        cfg = TuneConfig.from_json(best.tune_cfg)
        for op_type in ctx.space.op_types():
            keys = [k for k in ctx.space.tunable_ops if k[1] == op_type and cfg.ops[k].quantized]
            for variant in ctx.space.op_type_variants(op_type)[1:4]:
                ctx.evaluate(cfg.with_ops({k: variant for k in keys}), f"op-type {op_type}")


class ExhaustiveStrategy(Strategy):
    name = "exhaustive"

    def traverse(self, ctx: TuningContext) -> None:
        space = ctx.space
        keys = space.tunable_ops
        per_op = [[*space.choices[k], space.fallback(k)] for k in keys]
        for combo in itertools.product(*per_op):
            ctx.evaluate(space.make(dict(zip(keys, combo))), "exhaustive")


class RandomStrategy(Strategy):
    name = "random"

    def traverse(self, ctx: TuningContext) -> None:
        space = ctx.space
        fallback_rate = float(self.options.get("fallback_rate", 0.2))
        ctx.evaluate(space.default(), "default")
        seen: set[str] = set()
        misses = 0
        while misses < 100:
            ops = {
                key: space.fallback(key)
                if ctx.rng.random() < fallback_rate
                else ctx.rng.choice(space.choices[key])
                for key in space.tunable_ops
            }
            cfg = space.make(ops)
            if cfg.fingerprint() in seen:
                misses += 1
                continue
            seen.add(cfg.fingerprint())
            ctx.evaluate(cfg, "random")
