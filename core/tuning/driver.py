"""The tuning driver: runs a strategy's proposals through an executor, keeps the score.

It is the strategy's :class:`~lpq.strategy.TuningContext`. Before the first trial it
warms the adaptor's per-run state in this process (:meth:`TuningDriver.warm`), so worker
processes forked later inherit it and workers elsewhere find it in the run cache. For
each proposed batch it replays trials that already finished (this run or an earlier,
interrupted one), gives new trials their ids in proposal order, enforces the budget,
hands the new trials to the executor (a batch of one runs right here, keeping its
model), and records every outcome in the history the moment it arrives. It alone writes
the history.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..cache import using_run_cache
from ..config import PostTrainingQuantConfig
from ..errors import DataError
from ..plan.tune_config import OpKey, TuneConfig
from ..plan.tuning_space import TuningSpace
from ..strategy.base import Candidate, StopTuning, Strategy, TuningContext
from .deadline import DeadlineReached, deadline
from .executors import Executor, TrialOutcome
from .history import TuningHistory
from .records import TrialRecord
from .runner import LatencyRule, TrialRunner, TrialSpec
from .sensitivity import SensitivityProbe

logger = logging.getLogger("lpq")
_MISSING = object()

#: A candidate is "slower than fp32" only beyond this fraction plus this many ms: timing
#: noise on a busy machine (and on sub-millisecond models) must not turn a tie into a
#: verdict.
LATENCY_NOISE = 0.05
LATENCY_FLOOR_MS = 0.05

#: Called after every trial with the record (for progress display).
TrialCallback = Callable[[TrialRecord], None]


class TuningDriver(TuningContext):
    """One tuning run: the context strategies see, and the loop that feeds executors."""

    def __init__(
        self,
        *,
        space: TuningSpace,
        runner: TrialRunner,
        executor: Executor,
        history: TuningHistory,
        config: PostTrainingQuantConfig,
        baseline: TrialRecord,
        higher_is_better: bool,
        first_hit: bool,
        sensitivity_data: Any,
        on_trial: TrialCallback | None,
    ) -> None:
        self.space = space
        self.runner = runner
        self.executor = executor
        self.history = history
        self.config = config
        self.baseline = baseline
        self.higher_is_better = higher_is_better
        self.first_hit = first_hit
        self.rng = random.Random(config.tuning_criterion.seed)
        self.on_trial = on_trial
        self.by_fingerprint: dict[str, TrialRecord] = {}
        self.models: dict[str, Any] = {}
        self._best: TrialRecord | None = None
        self.best_any: TrialRecord | None = None
        #: The most accurate trial within the accuracy tolerance, fast or not: it tells
        #: "accuracy met, but nothing faster than fp32" from "accuracy goal not met".
        self.accurate_any: TrialRecord | None = None
        #: Configs whose converted model ran no op quantized: recipes on top of them
        #: cannot quantize anything either (see :meth:`_adds_recipes_to_nothing`).
        self._converted_nothing: list[TuneConfig] = []
        self.started = time.monotonic()
        self.stop_reason = "search space exhausted"
        self.used = 0  # trials this walk has spent, replayed ones included
        self._next_index = history.next_index()
        #: The latest trial's model, so inspecting the config just tried re-quantizes nothing.
        self._last_model: tuple[str, Any] = ("", None)
        self.sensitivity = SensitivityProbe(
            runner.framework, runner.model, space, sensitivity_data, self._model_for
        )
        #: Candidates that miss the accuracy goal get no latency pass (see LatencyRule).
        self.latency_rule = LatencyRule(
            baseline.accuracy, config.accuracy_criterion, higher_is_better
        )
        #: Models the warm-up quantized, by fingerprint, for the trial that asks first.
        self._prebuilt: dict[str, Any] = {}

    # ------------------------------------------------------------------ the loop

    def run(self, strategy: Strategy) -> None:
        """Warm the per-run state, then walk ``strategy`` to its end or until the exit
        policy stops it. How long each phase took goes to the history (``timing``)."""
        began = time.time()
        prepare_s = self.warm()
        started = time.monotonic()
        try:
            self._walk(strategy)
        finally:
            self._prebuilt.clear()
            self.history.extra["timing"] = {
                "began": began,  # wall clock, when the warm-up began
                "prepare_s": prepare_s,
                "trials_s": time.monotonic() - started,
            }
        self._time_the_answer()

    def _walk(self, strategy: Strategy) -> None:
        try:
            if not strategy.proposes:
                strategy.traverse(self)
                return
            proposals = strategy.propose(self)
            batch = next(proposals)
            while True:
                batch = proposals.send(self.run_batch(batch))
        except (StopIteration, StopTuning):
            return

    def _time_the_answer(self) -> None:
        """No candidate met the goal, so the answer is the most accurate one, which the
        latency rule did not time: time it now (the run reports its speed too)."""
        answer = self.best_any
        if (
            self._best is not None
            or answer is None
            or answer.latency_ms is not None
            or self.baseline.latency_ms is None
        ):
            return
        model = self.chosen_model(answer)
        self.models[answer.fingerprint] = model
        answer.latency_ms = self.runner.latency(model)
        self.history.write()

    def warm(self) -> float:
        """Quantize the default config here, before any worker exists; return seconds.

        The adaptor builds its per-run state on the way (prepared model, calibration
        statistics in :func:`lpq.run_cache`): forked workers inherit it, Ray workers
        load it from the run's cache folder, and no worker computes it again. With
        parallel workers, the default is also quantized with every other calibration
        algorithm of the space, so an algorithm's statistics are not first computed in
        whichever worker meets it — until one algorithm adds nothing to the run cache
        (the adaptor's statistics do not depend on the algorithm, as in lpq-onnxrt): the
        rest would only cost a quantization each. The default's model is kept for its
        trial (usually the first), so a serial run repeats nothing; a serial re-run
        whose default trial finished warms nothing. Errors are left to the trials.
        """
        start = time.monotonic()
        default = self.space.default()
        configs = [default]
        if self.executor.workers > 1 and self.executor.name != "serial":
            configs += [cfg for _, cfg in self.space.calibration_variants(default)]
        elif self.history.finished(default.fingerprint()) is not None:
            return 0.0  # a serial re-run: its trials build what they need, if they run
        with using_run_cache(self.runner.cache_dir) as cache:
            for cfg in configs:
                if not cfg.quantized_ops():
                    continue
                computed = cache.misses
                try:
                    model = self.runner.quantize_result(cfg)
                except DataError:
                    raise
                except Exception as exc:  # the trial of this config will record it
                    logger.debug("warm-up: quantizing %s failed: %s", cfg.fingerprint(), exc)
                    continue
                if cfg is default:
                    self._prebuilt[cfg.fingerprint()] = model
                elif cache.misses == computed:
                    break  # this algorithm needed no state of its own: assume none does
        return time.monotonic() - start

    def evaluate(self, cfg: TuneConfig, stage: str = "") -> TrialRecord:
        return self.run_batch([Candidate(cfg, stage)])[0]

    def run_batch(self, batch: list[Candidate]) -> list[TrialRecord]:
        """Resolve every candidate to a record (replayed, skipped or run), in order."""
        criterion = self.config.tuning_criterion
        if criterion.timeout and time.monotonic() - self.started > criterion.timeout:
            self._stop(f"timeout ({criterion.timeout:g} s) reached")
        self._stop_if_no_time_for_a_trial()
        results: list[TrialRecord | None] = []
        to_run: list[TrialSpec] = []
        budget_cut = False
        for candidate in batch:
            cfg = candidate.cfg
            fingerprint = cfg.fingerprint()
            known = self.by_fingerprint.get(fingerprint)
            if known is not None:
                results.append(known)
            elif not cfg.quantized_ops():
                results.append(self._skipped(cfg, candidate.stage))
            elif (empty := self._adds_recipes_to_nothing(cfg)) is not None:
                results.append(
                    self._skipped(
                        cfg,
                        candidate.stage,
                        "the same ops with fewer options converted to a model with no op "
                        f"quantized (trial {empty}): options added on top cannot change that",
                    )
                )
            elif self.used >= criterion.max_trials:
                budget_cut = True
                results.append(None)
            else:
                self.used += 1
                previous = self.history.finished(fingerprint)
                if previous is not None:
                    self._record(previous, replayed=True)
                    self._track(previous, None)
                    results.append(previous)
                else:
                    spec = TrialSpec(
                        self._next_index, cfg.to_json(), candidate.stage, self.latency_rule
                    )
                    self._next_index += 1
                    to_run.append(spec)
                    results.append(None)
        arrived: list[tuple[TrialRecord, Any]] = []
        if to_run:  # inspection of the last trial is over: let its model go (an LLM's: GBs)
            self._last_model = ("", None)
        try:
            with deadline(self._time_left()):
                for outcome in self._execute(to_run):  # recorded the moment each one finishes
                    self._record(outcome.record)
                    arrived.append((outcome.record, outcome.model))
                    self._release_losers(arrived)
        except DeadlineReached:
            self._stop_running_trials(to_run, arrived)
        for record, model in sorted(arrived, key=lambda item: item[0].index):
            self._track(record, model)  # in id order: ties resolve the same in any executor
        final = [
            r if r is not None else self.by_fingerprint.get(c.cfg.fingerprint())
            for r, c in zip(results, batch)
        ]
        if budget_cut:
            self._stop(f"max trials ({criterion.max_trials}) reached")
        if self.first_hit and any(r is not None and r.meets_goal for r in final):
            self._stop("accuracy goal met")
        return [r for r in final if r is not None]

    def _execute(self, specs: list[TrialSpec]) -> Iterator[TrialOutcome]:
        ready, self._prebuilt = self._prebuilt, {}  # only the first trials may use them
        models = [ready.get(spec.config().fingerprint()) for spec in specs]
        here = [i for i, model in enumerate(models) if model is not None]
        if len(specs) - len(here) == 1:
            here = list(range(len(specs)))  # nothing to overlap with
        # Run here (keeping the model): a trial whose model the warm-up built, or a lone one.
        for i in here:
            record, model = self.runner.run(specs[i], prebuilt=models[i])
            yield TrialOutcome(specs[i], record, model)
        rest = [spec for i, spec in enumerate(specs) if i not in here]
        if rest:
            yield from self.executor.run(rest)

    def _stop(self, reason: str) -> None:
        self.stop_reason = reason
        raise StopTuning(reason)

    def _time_left(self) -> float | None:
        """Seconds until ``--timeout`` (None without one)."""
        timeout = self.config.tuning_criterion.timeout
        if not timeout:
            return None
        return max(timeout - (time.monotonic() - self.started), 0.001)

    def _stop_running_trials(
        self, specs: list[TrialSpec], arrived: list[tuple[TrialRecord, Any]]
    ) -> None:
        """The limit ran out mid-batch: stop the executor's workers, keep what finished
        (recorded already), stop tuning. The stopped trials are not recorded, so a re-run
        with a larger ``--timeout`` resumes and runs them (:mod:`lpq.tuning.deadline`)."""
        self.executor.abort()
        done = {record.index for record, _ in arrived}
        stopped = [spec.index for spec in specs if spec.index not in done]
        for record, model in sorted(arrived, key=lambda item: item[0].index):
            self._track(record, model)
        timeout = self.config.tuning_criterion.timeout
        self._stop(
            f"timeout ({timeout:g} s) reached: trial {', '.join(map(str, stopped))} stopped "
            "at the limit and not recorded (re-run with a larger --timeout to run it)"
        )

    def _stop_if_no_time_for_a_trial(self) -> None:
        """``--timeout`` is a limit: no trial starts that the trials so far say cannot
        finish inside it (the median trial time is the estimate)."""
        timeout = self.config.tuning_criterion.timeout
        durations = [r.duration_s for r in self.history.ordered() if r.duration_s > 0]
        if not timeout or not durations:
            return
        elapsed = time.monotonic() - self.started
        estimate = statistics.median(durations)
        if elapsed + estimate > timeout:
            self._stop(
                f"timeout ({timeout:g} s): {elapsed:.0f} s used, and a trial takes about "
                f"{estimate:.0f} s, so the next one would not finish inside the limit"
            )

    def _adds_recipes_to_nothing(self, cfg: TuneConfig) -> int | None:
        """The index of a trial whose converted model quantized nothing, when ``cfg`` has
        that trial's ops and differs only in recipes that trial had off (false, 0, none)
        and ``cfg`` switches on; else None. Switching a recipe on (bias correction,
        SmoothQuant, AdaRound, latency-aware fallback) changes weights or drops ops back
        to float; it never turns a float op into a quantized one. Switching one off (a
        latency-aware default) may well quantize, so that still runs."""
        recipes = self.space.recipes
        for empty in self._converted_nothing:
            if cfg.ops != empty.ops:
                continue
            keys = set(cfg.options) | set(empty.options)
            if all(
                cfg.options.get(key, _MISSING) == empty.options.get(key, _MISSING)
                or (key in recipes and not empty.options.get(key, recipes[key][0]))
                for key in keys
            ):
                record = self.by_fingerprint.get(empty.fingerprint())
                return record.index if record is not None else -1
        return None

    def _skipped(
        self,
        cfg: TuneConfig,
        stage: str,
        reason: str = "every op would stay in fp32 (the baseline)",
    ) -> TrialRecord:
        # Every op in fp32 is the baseline itself, not a candidate: never "meets" the
        # goal, costs no trial, and is not written to the history.
        skipped = TrialRecord(
            index=-1,
            fingerprint=cfg.fingerprint(),
            tune_cfg=cfg.to_json(),
            stage=stage,
            status="skipped",
            error=reason,
            fallback_ops=len(cfg.fallback_ops()),
        )
        self.by_fingerprint[skipped.fingerprint] = skipped
        return skipped

    def _record(self, record: TrialRecord, *, replayed: bool = False) -> None:
        if not replayed:  # a replayed trial keeps its verdict: latency noise must not flip it
            record.meets_goal = self._meets(record)
            self.history.add(record)
        self.by_fingerprint[record.fingerprint] = record
        if record.resolved_fingerprint:  # what an adaptor-resolved choice really ran
            self.by_fingerprint.setdefault(record.resolved_fingerprint, record)
        if self.on_trial is not None:
            self.on_trial(record)

    def within_tolerance(self, record: TrialRecord) -> bool:
        return record.status == "ok" and self.latency_rule.wants(record.accuracy)

    def shortfall(self, record: TrialRecord) -> float | None:
        if record.status != "ok" or record.accuracy != record.accuracy:
            return None
        return self.latency_rule.shortfall(record.accuracy)

    def _meets(self, record: TrialRecord) -> bool:
        """Accuracy within tolerance and, for the performance objective, not slower than
        fp32: a slower "quantized" model is no answer to a speed goal."""
        if not self.within_tolerance(record):
            return False
        if record.counts_from == "model" and record.quantized_ops == 0:
            return False  # the converted model runs every op in float: it is the baseline
        if self.config.tuning_criterion.objective == "performance":
            base, got = self.baseline.latency_ms, record.latency_ms
            if (
                base is not None
                and got is not None
                and got > base * (1 + LATENCY_NOISE) + LATENCY_FLOOR_MS
            ):
                return False
        return True

    # ------------------------------------------------------------------ best so far

    def _track(self, record: TrialRecord, model: Any) -> None:
        if model is not None:
            self._last_model = (record.fingerprint, model)
        if record.status != "ok":
            return
        if record.counts_from == "model" and record.quantized_ops == 0:
            cfg = record.config()
            if cfg is not None:
                self._converted_nothing.append(cfg)
        if self.within_tolerance(record) and (
            self.accurate_any is None or self._more_accurate(record, self.accurate_any)
        ):
            self.accurate_any = record
        if record.meets_goal and self.better(record, self._best):
            self._keep(record, model, self._best)
            self._best = record
        if self.best_any is None or self._more_accurate(record, self.best_any):
            self._keep(record, model, self.best_any)
            self.best_any = record

    def _release_losers(self, arrived: list[tuple[TrialRecord, Any]]) -> None:
        """Drop, in place, the models of this batch's trials that :meth:`_track` will not
        keep: only the best and most accurate so far, and the latest (for inspection).

        A serial batch of N trials would otherwise hold N models until it ends: six
        narrowing trials of SmolLM2-135M are ~1.5 GB. Mirrors :meth:`_track` in arrival
        order, which is id order wherever models come back (serial, in the driver)."""
        best, best_any = self._best, self.best_any
        for record, _ in arrived:
            if record.status != "ok":
                continue
            if record.meets_goal and self.better(record, best):
                best = record
            if best_any is None or self._more_accurate(record, best_any):
                best_any = record
        keep = {r.fingerprint for r in (best, best_any) if r is not None}
        keep.add(arrived[-1][0].fingerprint)
        for i, (record, model) in enumerate(arrived):
            if model is not None and record.fingerprint not in keep:
                arrived[i] = (record, None)

    def _keep(self, record: TrialRecord, model: Any, replaced: TrialRecord | None) -> None:
        if model is not None:
            self.models[record.fingerprint] = model
        keep = {r.fingerprint for r in (record, self._best, self.best_any) if r is not None}
        if replaced is not None and replaced.fingerprint not in keep:
            self.models.pop(replaced.fingerprint, None)

    def _more_accurate(self, a: TrialRecord, b: TrialRecord) -> bool:
        return a.accuracy > b.accuracy if self.higher_is_better else a.accuracy < b.accuracy

    def meets_goal(self, record: TrialRecord) -> bool:
        return record.meets_goal

    def better(self, a: TrialRecord, b: TrialRecord | None) -> bool:
        if b is None:
            return True
        objective = self.config.tuning_criterion.objective
        value = {
            "performance": lambda r: r.latency_ms,
            "modelsize": lambda r: r.size_bytes,
            "footprint": lambda r: r.footprint_bytes,
        }[objective]
        va, vb = value(a), value(b)
        if va is not None and vb is not None and va != vb:
            return bool(va < vb)
        # No measurement to compare: more quantized ops, then higher accuracy, wins.
        if a.quantized_ops != b.quantized_ops:
            return a.quantized_ops > b.quantized_ops
        return self._more_accurate(a, b)

    @property
    def best(self) -> TrialRecord | None:
        return self._best

    # ------------------------------------------------------------------ sensitivity

    def op_sensitivity(self, cfg: TuneConfig) -> dict[OpKey, float] | None:
        return self.sensitivity(cfg)

    def _model_for(self, cfg: TuneConfig) -> Any:
        fingerprint = cfg.fingerprint()
        model = self.models.get(fingerprint)
        if model is None and self._last_model[0] == fingerprint:
            model = self._last_model[1]
        return model if model is not None else self.runner.quantize(cfg)

    def chosen_model(self, record: TrialRecord) -> Any:
        """The model of a finished trial; rebuilt when it ran elsewhere or earlier."""
        config = record.config()
        assert config is not None
        return self._model_for(config)
