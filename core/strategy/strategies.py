"""The built-in strategies. Each is registered through ``lpq_register_strategies``.

* ``auto`` (default): default config; then each other calibration algorithm; then
  error-guided fallback, re-inspecting the current config (``lpq_inspect_tensor``, no
  trial spent) after every step, so concentrated damage is found in a few trials; with
  ``exit_policy="best"`` it then re-quantizes ops greedily to improve the objective.
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
from dataclasses import replace
from typing import TYPE_CHECKING

from ..tune_config import OpKey, TuneConfig
from ..tuning_space import TuningSpace
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


def _calibration_variants(space: TuningSpace, cfg: TuneConfig) -> list[tuple[str, TuneConfig]]:
    """``cfg`` with every op's activation algorithm switched to each other algorithm the
    space allows (ops that don't allow it keep theirs)."""
    current = {c.activation.algorithm for c in cfg.ops.values() if c.quantized and c.activation}
    algorithms = dict.fromkeys(
        choice.activation.algorithm
        for key in space.tunable_ops
        for choice in space.choices[key]
        if choice.quantized and choice.activation is not None
    )
    variants = []
    for algorithm in algorithms:
        if algorithm in current:
            continue
        changes = {}
        for key in space.tunable_ops:
            op = cfg.ops[key]
            if not op.quantized or op.activation is None:
                continue
            wanted = replace(op, activation=replace(op.activation, algorithm=algorithm))
            if wanted in space.choices[key]:
                changes[key] = wanted
        if changes:
            variants.append((algorithm, cfg.with_ops(changes)))
    return variants


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
    """Meet the goal in few trials, then (exit policy ``best``) improve the objective.

    After the default config, each step re-measures per-op error on the *current*
    config and falls back the ops whose marginal error is close to the worst. Measuring
    again matters: once the first culprit's damage is gone, a culprit further down the
    graph, hidden behind it until then, becomes visible.
    """

    name = "auto"
    #: Ops scoring at least this fraction of the worst score fall back together.
    group_ratio = 0.3
    #: At most this fraction of the tunable ops (at least one) falls back per step.
    group_fraction = 0.1

    def traverse(self, ctx: TuningContext) -> None:
        space = ctx.space
        cfg = space.default()
        fallen: list[OpKey] = []
        record = ctx.evaluate(cfg, "default")
        if not ctx.meets_goal(record):
            # A clipping calibration (kl, percentile) often rescues outlier-heavy
            # activations with every op still quantized: one cheap trial each.
            for algorithm, candidate in _calibration_variants(space, cfg):
                tried = ctx.evaluate(candidate, f"calibrate with {algorithm}")
                if ctx.meets_goal(tried):
                    cfg, record = candidate, tried
                    break
                if _improves(ctx, tried, record):
                    cfg, record = candidate, tried
        if not ctx.meets_goal(record):
            if ctx.op_sensitivity(cfg) is None:
                found = self._fallback_by_probe(ctx, cfg)
            else:
                found = self._fallback_by_error(ctx, cfg)
            if found is None:
                return
            cfg, fallen = found
        # Budget left (exit policy "best"): win back fallen ops, then try other options.
        self._requantize_greedily(ctx, cfg, fallen)
        self._try_variants(ctx)

    def _fallback_by_error(
        self, ctx: TuningContext, cfg: TuneConfig
    ) -> tuple[TuneConfig, list[OpKey]] | None:
        fallen: list[OpKey] = []
        cap = max(1, math.ceil(self.group_fraction * len(ctx.space.tunable_ops)))
        while True:
            scores = ctx.op_sensitivity(cfg) or {}
            if not scores:
                return None
            ranked = sorted(scores, key=lambda key: -scores[key])
            top = scores[ranked[0]]
            group = [key for key in ranked if scores[key] >= self.group_ratio * top][:cap]
            if len(group) == len(ranked) > 1:
                group = group[:-1]  # all-fp32 is the baseline, not an answer
            fallen += group
            cfg = fall_back(ctx.space, cfg, group)
            if ctx.meets_goal(ctx.evaluate(cfg, f"fallback {len(fallen)} by error")):
                return cfg, fallen

    def _fallback_by_probe(
        self, ctx: TuningContext, cfg: TuneConfig
    ) -> tuple[TuneConfig, list[OpKey]] | None:
        """Without tensor inspection: measure each op's impact with a trial, then fall
        back in order of impact, in growing groups."""
        impact = _probe_op_by_op(ctx, cfg, "probe op by op")
        order = sorted(impact, key=lambda key: -impact[key])
        size = 1
        while True:
            candidate = fall_back(ctx.space, cfg, order[:size])
            if ctx.meets_goal(ctx.evaluate(candidate, f"fallback top {size}")):
                return candidate, order[:size]
            if size >= len(order):
                return None
            size = min(len(order), max(size + 1, int(size * 1.5)))

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
