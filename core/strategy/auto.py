"""``auto`` (the default): meet the goal in few trials, then improve the objective.

1. The default config.
2. Each other calibration algorithm the space allows (clipping calibrations such as kl
   or percentile rescue outlier-heavy activations with every op still quantized), then
   each other value of the adaptor's model-wide *recipes* (capability ``recipes``, e.g.
   SmoothQuant, cross-layer equalization), one batch each. A variant is kept only if it
   closes at least 5% of the gap to the goal: a recipe kept for a noise-level gain would
   be paid for again by every later trial. *Slow* recipes (capability
   ``slow_recipes``, e.g. AdaRound) wait until after stage 5.
2b. **Widening** (spaces with wider quantized choices, e.g. int4/int8 weight-only LLMs;
   :mod:`lpq.strategy.widening`): groups of ops found from their names (``attn`` /
   ``mlp``, projection kinds, blocks of layers) are widened alone (one batch), then
   together, most helpful first, until the goal is met; then what the goal does not
   need is narrowed back, group by finer group, and what must stay wide is tried at
   its first width with a finer block (int4 block 16 instead of int8) where the space
   has one. Only if widening cannot meet the goal do the fallback stages below run, on
   the widened config.
3. One trial falling back the few ops whose inspected error (``lpq_inspect_tensor``, no
   trial spent) stands out: damage concentrated in a handful of ops ends here.
4. **Op-type-wise**: fall back each op type alone (one batch). A model whose damage
   sits in one op type (e.g. its Add or Softmax ops) is fixed here in one step; if no
   single type is enough, fall back types cumulatively, most harmful first. A type whose
   fallback leaves no op running int8 is the fp32 baseline: if it is accurate, its ops
   are won back but the 1, 2 or 3 most harmful (one batch, as in stage 6); else, or if
   that misses, it is left out of the cumulative walk.
5. **Op-wise, by effect on the output**: the ops with the largest inspected error are
   only *candidates*; falling back each alone (one batch) measures what it really does
   to the model's output, and ops are fallen back in that order. A fallback that makes
   accuracy worse is backed out and the op is kept quantized, so growing fallback sets
   cannot collapse accuracy. Error is re-measured after each step: once a culprit's
   damage is gone, one further down the graph becomes visible.
5b. Still short of the goal: the slow recipes, one batch, on what stages 3-5 left.
6. Accurate enough but not faster than fp32 (a whole op type fell back for one harmful
   op of it; or every int8 op left runs in float): win the fallen ops back in one batch,
   all but the 1, 2 or 3 most harmful by inspected error. Stages 4 and 5 only consider
   ops the converted model really runs quantized (``runs_quantized``).
7. Still accurate but slower than fp32: retry with the adaptor's recipes.
8. With ``exit_policy="best"`` and budget left: win back fallen ops greedily and try the
   other options of each op type and the other recipe values (e.g. latency-aware
   quantization, which keeps in fp32 what int8 makes slower on this machine), and
   quantizing the op types the capability keeps float by default (``defaults``).
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

from ..plan.tune_config import OpKey, TuneConfig
from ..plan.tuning_space import bit_width
from ..tuning.records import TrialRecord
from .base import (
    Candidate,
    Proposals,
    Strategy,
    TuningContext,
    accuracy_gain,
    fall_back,
    improves,
    one,
    probe_op_by_op,
    ranked,
    requantize,
    runs_quantized,
)
from .widening import Widening

#: A sub-walk: yields batches, returns what it found.
Walk = Generator[list[Candidate], list[TrialRecord], "Found | None"]
Found = tuple[TuneConfig, TrialRecord, list[OpKey]]


class AutoStrategy(Strategy):
    name = "auto"
    option_names: frozenset[str] | None = frozenset()
    #: How many of the worst ops (by inspected error) are verified on the output per step.
    verify_top = 4
    #: First step: ops scoring at least this fraction of the worst score fall back
    #: together, at most this fraction of the tunable ops (at least one).
    group_ratio = 0.3
    group_fraction = 0.1
    #: Most fallen ops kept in float when winning the others back in one batch.
    win_back_max = 3
    #: A calibration or recipe variant is adopted only if it closes at least this share
    #: of the remaining gap to the accuracy goal.
    min_gain_share = 0.05

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.widening = Widening(min_gain_share=self.min_gain_share)

    def propose(self, ctx: TuningContext) -> Proposals:
        space = ctx.space
        cfg = space.default()
        record = yield from one(cfg, "default")
        fallen: list[OpKey] = []
        if not ctx.meets_goal(record) and not runs_all_float(record):
            cfg, record = yield from self._best_of(
                ctx, cfg, record, ctx.space.calibration_variants(cfg), "calibrate with"
            )
        if not ctx.meets_goal(record):
            cfg, record = yield from self._best_of(
                ctx, cfg, record, ctx.space.recipe_variants(cfg, slow=False), "recipe"
            )
        widened_enough = False
        if not ctx.meets_goal(record):
            # Wider quantized choices (int4 -> int8 weight-only) before any float fallback.
            widened = yield from self.widening.widen(ctx, cfg, record)
            if widened is not None:
                reference = cfg
                cfg, record, groups, widened_enough = widened
                if widened_enough:
                    cfg, record = yield from self.widening.narrow_back(
                        ctx, cfg, record, groups, reference
                    )
        for stage in (self._worst_by_error, self._op_types, self._ops):
            if ctx.meets_goal(record) or widened_enough:
                break
            found = yield from stage(ctx, cfg, record, fallen)
            if found is not None:
                cfg, record, fallen = found
        if not ctx.meets_goal(record):
            # Slow recipes last (AdaRound: 82 s a trial on PP-OCRv4 det where a fallback
            # trial took 5 s, for +0.002 IoU), on what the fallback stages left.
            cfg, record = yield from self._best_of(
                ctx, cfg, record, ctx.space.recipe_variants(cfg, slow=True), "recipe"
            )
        if not ctx.meets_goal(record) and ctx.within_tolerance(record) and fallen:
            # Accurate enough, but what fell back left too little int8 to be faster than
            # fp32 (a whole op type, when one op of it did the damage): win ops back.
            found = yield from self._win_back(ctx, cfg, record, fallen)
            if found is not None:
                cfg, record, fallen = found
        if not ctx.meets_goal(record) and ctx.within_tolerance(record):
            # Accurate enough but slower than fp32 (int8 islands between float ops): let
            # the adaptor's recipes, e.g. latency-aware quantization, make it fast.
            cfg, record = yield from self._best_of(
                ctx, cfg, record, ctx.space.recipe_variants(cfg, slow=False), "speed up with"
            )
        if ctx.meets_goal(record):
            yield from self._requantize_greedily(ctx, cfg, fallen)
        yield from self._try_variants(ctx, cfg)

    # ------------------------------------------------------------------ stages

    def _best_of(
        self,
        ctx: TuningContext,
        cfg: TuneConfig,
        record: TrialRecord,
        variants: list[tuple[str, TuneConfig]],
        stage: str,
    ) -> Generator[list[Candidate], list[TrialRecord], tuple[TuneConfig, TrialRecord]]:
        """Try ``variants`` of ``cfg`` (one batch); the first that meets the goal, else
        the most accurate one that improves on ``record`` by a gain that matters (see
        :meth:`_worth_keeping`), else ``cfg``."""
        if not variants:
            return cfg, record
        records = yield [Candidate(c, f"{stage} {name}") for name, c in variants]
        for (_, candidate), tried in zip(variants, records):
            if ctx.meets_goal(tried) and not ctx.meets_goal(record):
                return candidate, tried
            if self._worth_keeping(ctx, tried, record):
                cfg, record = candidate, tried
        return cfg, record

    def _worth_keeping(self, ctx: TuningContext, tried: TrialRecord, record: TrialRecord) -> bool:
        """Whether a variant's gain over ``record`` is worth carrying into every later
        trial: at least :attr:`min_gain_share` of the way still to go to the goal.

        A recipe kept for a noise-level gain is paid for again by each later trial: on
        PP-OCRv4 det, AdaRound added 0.002 IoU with 0.049 still to go and made every
        following trial 3x slower (107 s instead of 36 s), so the 300 s budget ended before
        the op-type stage was through."""
        if not improves(ctx, tried, record):
            return False
        short = ctx.shortfall(record)
        if short is None or short <= 0:
            return True
        return accuracy_gain(ctx, tried, record) >= self.min_gain_share * short

    def _worst_by_error(
        self, ctx: TuningContext, cfg: TuneConfig, record: TrialRecord, fallen: list[OpKey]
    ) -> Walk:
        """One trial: fall back the few ops whose inspected error stands out. Damage
        concentrated in a handful of ops is fixed here, keeping every other op int8."""
        scores = ctx.op_sensitivity(cfg)
        if not scores:
            return None
        running = set(runs_quantized(ctx, cfg, record))
        order = [key for key in ranked(ctx, cfg, scores) if key in running]
        if not order:
            return None
        top = scores[order[0]]
        cap = max(1, math.ceil(self.group_fraction * len(ctx.space.tunable_ops)))
        group = [k for k in order if scores[k] >= self.group_ratio * top][:cap]
        if len(group) >= len(order):
            group = group[:-1]  # all-fp32 is the baseline, not an answer
        if not group:
            return None
        candidate = fall_back(ctx.space, cfg, group)
        tried = yield from one(candidate, f"fallback {len(fallen) + len(group)} by error")
        if ctx.meets_goal(tried) or improves(ctx, tried, record):
            return candidate, tried, fallen + group
        return None

    def _op_types(
        self, ctx: TuningContext, cfg: TuneConfig, record: TrialRecord, fallen: list[OpKey]
    ) -> Walk:
        space = ctx.space
        running = runs_quantized(ctx, cfg, record)
        keys_of = {t: [k for k in running if k[1] == t] for t in space.op_types()}
        types = [t for t, keys in keys_of.items() if keys]
        if len(types) < 2:
            return None
        singles = [fall_back(space, cfg, keys_of[t]) for t in types]
        records = yield [Candidate(c, f"fallback op type {t}") for t, c in zip(types, singles)]
        meeting = [i for i, r in enumerate(records) if ctx.meets_goal(r)]
        if meeting:
            best = meeting[0]
            for i in meeting[1:]:
                if ctx.better(records[i], records[best]):
                    best = i
            return singles[best], records[best], fallen + keys_of[types[best]]
        # A type whose fallback leaves no op running int8 (every Conv of PP-OCRv4 det or
        # Silero VAD: the Adds and Sigmoids then have no int8 neighbour) is the fp32
        # baseline in disguise. If it is accurate, the damage is inside it: win its ops
        # back but the few most harmful (one batch; on VAD that meets the goal). Else, or
        # if that fails, it is no base for further types: the op-wise stage looks inside.
        for single, tried, t in zip(singles, records, types):
            if runs_all_float(tried) and ctx.within_tolerance(tried):
                found = yield from self._win_back(ctx, single, tried, keys_of[t])
                if found is not None and ctx.meets_goal(found[1]):
                    return found[0], found[1], fallen + found[2]
                break
        gain = {
            t: accuracy_gain(ctx, r, record)
            for t, r in zip(types, records)
            if not runs_all_float(r)
        }
        order = sorted((t for t in gain if gain[t] > 0), key=lambda t: -gain[t])
        current, current_record, current_fallen = cfg, record, list(fallen)
        for t in order[: len(types) - 1]:  # all-fp32 is the baseline, not an answer
            candidate = fall_back(space, current, keys_of[t])
            tried = yield from one(candidate, f"fallback op types to {t}")
            if ctx.meets_goal(tried):
                return candidate, tried, current_fallen + keys_of[t]
            if improves(ctx, tried, current_record):
                current, current_record = candidate, tried
                current_fallen = current_fallen + keys_of[t]
        if current is cfg:
            return None
        return current, current_record, current_fallen

    def _ops(
        self, ctx: TuningContext, cfg: TuneConfig, record: TrialRecord, fallen: list[OpKey]
    ) -> Walk:
        space = ctx.space
        fallen = list(fallen)
        kept: set[OpKey] = set()  # ops whose fallback did not help: stay quantized
        while True:
            quantized = runs_quantized(ctx, cfg, record)
            open_ops = [k for k in quantized if k not in kept]
            if len(quantized) <= 1 or not open_ops:
                return (cfg, record, fallen) if fallen else None
            scores = ctx.op_sensitivity(cfg)
            if scores is None:  # no inspection: verify every open op on the output
                top = open_ops
            else:
                top = [k for k in ranked(ctx, cfg, scores) if k in open_ops][: self.verify_top]
            impact = yield from probe_op_by_op(ctx, cfg, "probe ops on the output", top)
            helpful = sorted((k for k in top if impact[k] > 0), key=lambda k: -impact[k])
            kept.update(k for k in top if impact[k] <= 0)
            for key in helpful:
                if sum(1 for k in space.tunable_ops if cfg.ops[k].quantized) <= 1:
                    break
                candidate = fall_back(space, cfg, [key])
                tried = yield from one(candidate, f"fallback {len(fallen) + 1} by output effect")
                if ctx.meets_goal(tried):
                    return candidate, tried, [*fallen, key]
                if improves(ctx, tried, record):
                    cfg, record = candidate, tried
                    fallen.append(key)
                else:
                    kept.add(key)  # together with the others it hurts: back it out

    def _win_back(
        self, ctx: TuningContext, cfg: TuneConfig, record: TrialRecord, fallen: list[OpKey]
    ) -> Walk:
        """One batch: ``cfg`` with every fallen op quantized again except the ``k`` most
        harmful (by inspected error of the default config), for k = 1, 2, 3. The first
        that meets the goal wins; else the one with most int8 ops still within tolerance
        (the fastest candidate for the next stages to speed up)."""
        space = ctx.space
        reference = space.default()
        scores = ctx.op_sensitivity(reference) or {}
        order = sorted(fallen, key=lambda key: -scores.get(key, 0.0))
        keeps = [order[:k] for k in range(1, min(self.win_back_max, len(order) - 1) + 1)]
        if not keeps:
            return None
        candidates = [
            requantize(space, cfg, [key for key in fallen if key not in keep], reference)
            for keep in keeps
        ]
        records = yield [
            Candidate(c, f"win back all but {len(keep)} fallen")
            for keep, c in zip(keeps, candidates)
        ]
        accurate = None
        for keep, candidate, tried in zip(keeps, candidates, records):
            if ctx.meets_goal(tried):
                return candidate, tried, list(keep)
            if accurate is None and ctx.within_tolerance(tried):
                accurate = (candidate, tried, list(keep))
        return accurate

    def _requantize_greedily(
        self, ctx: TuningContext, cfg: TuneConfig, fallen: list[OpKey]
    ) -> Proposals:
        reference = ctx.space.default()
        for key in reversed(fallen):
            candidate = requantize(ctx.space, cfg, [key], reference)
            if ctx.meets_goal((yield from one(candidate, f"requantize {key[0]}"))):
                cfg = candidate

    def _try_variants(self, ctx: TuningContext, fallback_cfg: TuneConfig) -> Proposals:
        """Other options per op type and other recipes (e.g. latency-aware quantization),
        from the best config (or the current one)."""
        best = ctx.best
        cfg = best.config() if best is not None and best.tune_cfg is not None else fallback_cfg
        assert cfg is not None
        candidates = [Candidate(c, f"recipe {name}") for name, c in ctx.space.recipe_variants(cfg)]
        space = ctx.space
        for op_type in space.op_types():
            keys = [k for k in space.tunable_ops if k[1] == op_type and cfg.ops[k].quantized]
            for variant in space.op_type_variants(op_type)[1:4]:
                # A variant of another bit width would undo a mix the widening stage
                # found (int4 and int8 MatMuls): it applies to the ops of its width only.
                same = [k for k in keys if bit_width(cfg.ops[k]) == bit_width(variant)]
                if same:
                    candidates.append(
                        Candidate(cfg.with_ops(dict.fromkeys(same, variant)), f"op-type {op_type}")
                    )
            floats = [
                k
                for k in space.tunable_ops
                if k[1] == op_type and k in space.float_defaults and not cfg.ops[k].quantized
            ]
            if floats:  # float by the capability's default: int8 may still pay here
                changes = {k: space.choices[k][0] for k in floats}
                candidates.append(Candidate(cfg.with_ops(changes), f"quantize op type {op_type}"))
        if candidates:
            yield candidates


def runs_all_float(record: TrialRecord) -> bool:
    """Whether the converted model ran every op in float (read from the model, e.g. when
    latency-aware quantization found int8 slower everywhere): no calibration can matter."""
    return record.status == "ok" and record.counts_from == "model" and record.quantized_ops == 0
