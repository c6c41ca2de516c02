"""Widening: step ops up to a wider quantized choice before falling them back to float.

On a weight-only LLM the space offers int4 and int8 per MatMul. An int4 -> fp32
fallback of a few MatMuls buys little accuracy for much speed, and a per-op search
cannot afford its trials (each quantizes the whole model). So ``auto`` first *widens*
(:meth:`TuningSpace.wider`: int4 -> int8) whole groups of ops found from their names
(:func:`lpq.plan.op_groups.split_groups`: ``attn`` / ``mlp``, then projection kinds,
then blocks of layers):

1. **Probe** (one batch): each group widened alone. One that meets the goal ends the
   walk (of several, the one with the fewest widened ops).
2. **Cumulate**: groups whose widening closed a share of the gap that matters are
   widened together, most helpful first, one trial each, until the goal is met; then
   the rest at once. A step that does not help is backed out.
3. **Narrow back** (goal met): the widened groups are split one level finer, and each
   part narrowed back alone (one batch); those still accurate enough are narrowed
   together, least harmful first, one trial each; the parts that had to stay wide are
   split again, for ``narrow_levels`` levels.
4. **Finer** (spaces with a smaller block size): the parts that had to stay wide are
   put back at their first width with the next finer block (:meth:`TuningSpace.finer`:
   int4 block 16 instead of int8: smaller, a little faster), alone (one batch), then
   together, as in step 3.

On SmolLM2-135M (30 layers of qkv/o/gate/up/down) that is 3 probes (attn, mlp and the
ops outside the layers), then the MLP's 3 kinds, then halves of the layers. A space
without wider choices (static or dynamic int8) is never touched. "Meets the goal"
here is the accuracy goal (:func:`_accurate`): a latency verdict on one trial does not
steer a walk whose every step changes speed in a known direction.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

from ..plan.op_groups import Group, split_groups
from ..plan.tune_config import FLOAT_PRECISIONS, OpConfig, OpKey, TuneConfig
from ..plan.tuning_space import TuningSpace
from ..tuning.records import TrialRecord
from .base import Candidate, TuningContext, accuracy_gain, improves, one

#: What the widening walk found: the config, its record, the widened groups, and
#: whether it is accurate enough (:func:`_accurate`).
Widened = tuple[TuneConfig, TrialRecord, list[Group], bool]


def _accurate(ctx: TuningContext, record: TrialRecord) -> bool:
    """Whether ``record`` is accurate enough for the widening walk: it meets the goal, or
    its accuracy does and only its measured latency says "slower than fp32".

    Widening and narrowing change bit widths only, and a narrower op is never slower
    (int4 MatMulNBits beats int8, which beats fp32), so a latency verdict on one trial
    must not send the walk elsewhere: on 2 shared cores under load the prefill of an
    all-int8 SmolLM2 once measured 4460 ms against fp32's 1786, and the run went on to
    fp32 fallbacks. The driver still answers with a goal-meeting trial only."""
    return ctx.meets_goal(record) or ctx.within_tolerance(record)


def widenable(ctx: TuningContext, cfg: TuneConfig, record: TrialRecord) -> list[OpKey]:
    """The tunable ops ``cfg`` quantizes that have a wider choice and whose precision
    the adaptor did not decide itself: an op planned int4 that ran int8 or in float
    (lpq-onnxrt's ``lm_head=auto``) would not change if widened, so probing it is a
    wasted trial (read from the model when the adaptor reported it)."""
    space = ctx.space
    ran = record.op_precisions if record.counts_from == "model" else None
    keys = []
    for key in space.tunable_ops:
        choice = cfg.ops[key]
        wider = space.wider(key, choice) if choice.quantized else None
        if wider is None:
            continue
        actual = (ran or {}).get(key[0])
        if actual is not None and (actual in FLOAT_PRECISIONS or actual == wider.precision):
            continue
        keys.append(key)
    return keys


def widen(space: TuningSpace, cfg: TuneConfig, keys: list[OpKey]) -> TuneConfig:
    """``cfg`` with ``keys`` one step wider (:meth:`TuningSpace.wider`) where possible."""
    return _stepped(space.wider, cfg, keys)


def refine(space: TuningSpace, cfg: TuneConfig, keys: list[OpKey]) -> TuneConfig:
    """``cfg`` with ``keys`` at the next finer block (:meth:`TuningSpace.finer`), same
    width, where the space has one."""
    return _stepped(space.finer, cfg, keys)


def _stepped(
    step: Callable[[OpKey, OpConfig], OpConfig | None], cfg: TuneConfig, keys: list[OpKey]
) -> TuneConfig:
    """``cfg`` with each of ``keys`` moved by ``step`` (where it gives a config)."""
    changes = {}
    for key in keys:
        moved = step(key, cfg.ops[key])
        if moved is not None:
            changes[key] = moved
    return cfg.with_ops(changes)


def narrow(cfg: TuneConfig, keys: list[OpKey], reference: TuneConfig) -> TuneConfig:
    """``cfg`` with ``keys`` back to their choice in ``reference`` (before widening)."""
    return cfg.with_ops({key: reference.ops[key] for key in keys if key in reference.ops})


@dataclass
class Widening:
    """The widening stages of ``auto`` (see the module docstring)."""

    #: Most groups probed in one batch (and narrowed on the first level).
    parts: int = 4
    #: A group is widened in the cumulative walk only if, widened alone, it closed at
    #: least this share of the gap to the goal (noise must not buy int8 ops).
    min_gain_share: float = 0.05
    #: How many levels of finer groups the narrowing walk descends.
    narrow_levels: int = 2

    def widen(
        self, ctx: TuningContext, cfg: TuneConfig, record: TrialRecord
    ) -> Generator[list[Candidate], list[TrialRecord], Widened | None]:
        """Probe, then cumulate (steps 1-2); ``None`` if no widening helped."""
        keys = widenable(ctx, cfg, record)
        if not keys:
            return None
        groups = split_groups(keys, self.parts) or [(keys[0][0], keys)]
        configs = [widen(ctx.space, cfg, members) for _, members in groups]
        records = yield [Candidate(c, f"widen {label}") for (label, _), c in zip(groups, configs)]
        accurate = [i for i, r in enumerate(records) if _accurate(ctx, r)]
        if accurate:
            # goal-meeting first, then the fewest widened ops (the fastest by construction)
            best = min(
                accurate, key=lambda i: (not ctx.meets_goal(records[i]), len(groups[i][1]), i)
            )
            return configs[best], records[best], [groups[best]], True
        short = ctx.shortfall(record)
        floor = self.min_gain_share * short if short is not None and short > 0 else 0.0
        gains = [accuracy_gain(ctx, r, record) for r in records]
        order = sorted(
            (i for i, gain in enumerate(gains) if gain > 0 and gain >= floor),
            key=lambda i: -gains[i],
        )
        done: list[Group] = []
        current, current_record = cfg, record
        for step, i in enumerate(order):
            if step == 0:  # measured in the probe already
                candidate, tried = configs[i], records[i]
            else:
                candidate = widen(ctx.space, current, groups[i][1])
                tried = yield from one(candidate, f"widen {groups[i][0]} too")
            if _accurate(ctx, tried):
                return candidate, tried, [*done, groups[i]], True
            if improves(ctx, tried, current_record):
                current, current_record = candidate, tried
                done.append(groups[i])
        rest = [g for g in groups if g not in done]
        if rest and done:  # widening every group is the most widening can do
            members = [key for _, group in rest for key in group]
            candidate = widen(ctx.space, current, members)
            tried = yield from one(candidate, "widen the other groups too")
            label = "+".join(label for label, _ in rest)
            if _accurate(ctx, tried):
                return candidate, tried, [*done, (label, members)], True
            if improves(ctx, tried, current_record):
                current, current_record = candidate, tried
                done.append((label, members))
        if not done:
            return None
        return current, current_record, done, False

    def narrow_back(
        self,
        ctx: TuningContext,
        cfg: TuneConfig,
        record: TrialRecord,
        groups: list[Group],
        reference: TuneConfig,
    ) -> Generator[list[Candidate], list[TrialRecord], tuple[TuneConfig, TrialRecord]]:
        """Steps 3-4: narrow back what the goal does not need, then put what had to stay
        wide at its first width with a finer block; returns the narrowest goal-meeting
        config found (``cfg`` if none)."""
        wide = groups
        stuck: list[Group] = []  # wide groups of one op: nothing to split further
        for level in range(self.narrow_levels):
            parts: list[Group] = []
            for label, members in wide:
                split = split_groups(members, self.parts if level == 0 else 2)
                if split:
                    parts += split
                else:
                    stuck.append((label, members))
            wide = []
            if not parts:
                break
            cfg, record, kept = yield from self._take(
                ctx, cfg, record, parts, "narrow", lambda c, m: narrow(c, m, reference)
            )
            wide = kept
        # Step 4: int4 block 16 costs less than int8: 6 bits a weight (fp32 scales) vs 9,
        # and on ORT's kernels a little time (SmolLM2: 8.0 vs 8.4 ms/token, all of it)
        space = ctx.space
        finer = []
        for label, members in [*stuck, *wide]:
            narrowed = narrow(cfg, members, reference)
            if refine(space, narrowed, members) != narrowed:
                finer.append((label, members))
        if finer:
            cfg, record, _ = yield from self._take(
                ctx,
                cfg,
                record,
                finer,
                "finer",
                lambda c, m: refine(space, narrow(c, m, reference), m),
            )
        return cfg, record

    def _take(
        self,
        ctx: TuningContext,
        cfg: TuneConfig,
        record: TrialRecord,
        parts: list[Group],
        verb: str,
        step: Callable[[TuneConfig, list[OpKey]], TuneConfig],
    ) -> Generator[list[Candidate], list[TrialRecord], tuple[TuneConfig, TrialRecord, list[Group]]]:
        """Each part stepped alone (one batch); those still accurate enough are stepped
        together, least harmful first, one trial each. Returns the config reached, its
        record and the parts not stepped."""
        configs = [step(cfg, members) for _, members in parts]
        records = yield [Candidate(c, f"{verb} {label}") for (label, _), c in zip(parts, configs)]
        ok = sorted(
            (i for i, r in enumerate(records) if _accurate(ctx, r)),
            key=lambda i: -accuracy_gain(ctx, records[i], record),
        )
        taken: set[int] = set()
        for n, i in enumerate(ok):
            if n == 0:
                candidate, tried = configs[i], records[i]
            else:
                candidate = step(cfg, parts[i][1])
                tried = yield from one(candidate, f"{verb} {parts[i][0]} too")
            if _accurate(ctx, tried):
                cfg, record = candidate, tried
                taken.add(i)
        return cfg, record, [part for i, part in enumerate(parts) if i not in taken]
