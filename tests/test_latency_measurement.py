"""How a trial's latency is measured: enough runs for the model's size, a low quantile."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from core_testutil import fit_fake

import lpq
from lpq.eval.evaluation import LatencyMeasurer
from lpq.plugins.types import AdaptorInfo
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel, FakeQuantizedModel
from lpq.tuning.runner import Evaluation, _Cycle


def test_quantile_of_the_timed_batches():
    measurer = LatencyMeasurer(warmup=0)
    measurer.samples = [0.005, 0.001, 0.002, 0.010, 0.003]
    assert measurer.quantile_ms(0.2) == pytest.approx(2.0)
    assert measurer.quantile_ms(0.0) == pytest.approx(1.0)
    assert measurer.quantile_ms(1.0) == pytest.approx(10.0)
    assert LatencyMeasurer().quantile_ms(0.2) is None


def test_cycle_runs_the_minimum_then_while_asked_up_to_the_maximum():
    data = [1, 2, 3]
    assert list(_Cycle(data, 5)) == [1, 2, 3, 1, 2]
    asked = iter([True, True, False])
    assert len(list(_Cycle(data, 2, 100, lambda: next(asked)))) == 4
    assert len(list(_Cycle(data, 2, 7, lambda: True))) == 7
    assert list(_Cycle([], 5, 10, lambda: True)) == []  # an empty loader ends, not loops


class _ScriptedTimes:
    """An adaptor whose batches take scripted times: ``slow`` every fifth batch (another
    job on the machine), ``fast`` otherwise. Counts the batches it was given."""

    def __init__(self, fast: float, slow: float) -> None:
        self.fast, self.slow, self.batches = fast, slow, 0

    @lpq.hookimpl
    def lpq_register_adaptors(self, register):
        register(AdaptorInfo("scripted", "numpy", [], "scripted batch times"))

    @lpq.hookimpl
    def lpq_evaluate(self, framework, model, dataloader, postprocess, metrics, measurer, iteration):
        if framework != "scripted":
            return None
        for _ in dataloader:
            self.batches += 1
            elapsed = self.slow if self.batches % 5 == 0 else self.fast
            with _clock(measurer, elapsed):
                pass
        return lpq.EvalResult({}, batches=self.batches)


@contextmanager
def _clock(measurer: LatencyMeasurer, elapsed: float) -> Iterator[None]:
    """Time a batch as ``elapsed`` seconds (what ``measurer.measure()`` would record)."""
    yield
    measurer._seen += 1
    if measurer._seen > measurer.warmup:
        measurer.samples.append(elapsed)


@pytest.fixture
def scripted(lpq_plugin: Any) -> Any:
    def make(fast: float, slow: float) -> _ScriptedTimes:
        plugin = _ScriptedTimes(fast, slow)
        lpq_plugin(plugin, name="scripted")
        return plugin

    return make


def _evaluation() -> Evaluation:
    return Evaluation("scripted", latency_dataloader=[np.zeros((1, 4), np.float32)])


def test_a_fast_model_is_timed_until_the_budget_and_reads_its_own_speed(scripted):
    plugin = scripted(fast=0.0001, slow=0.001)
    evaluation = _evaluation()
    latency = evaluation.latency(object())
    # 0.1 ms batches: the 0.25 s budget is never reached, the 200-run cap ends it.
    assert plugin.batches == evaluation.latency_warmup + evaluation.latency_max_repeats
    # One batch in five was slowed by another job: the latency is the model's own.
    assert latency == pytest.approx(0.1)


def test_a_slow_model_is_timed_the_minimum_number_of_runs(scripted):
    plugin = scripted(fast=0.2, slow=0.3)
    evaluation = _evaluation()
    assert evaluation.latency(object()) == pytest.approx(200.0)
    assert plugin.batches == evaluation.latency_warmup + evaluation.latency_repeats


class _ScriptedLatency(FakeAdaptorPlugin):
    """The fake adaptor, each timed batch taking what :meth:`timed_ms` says."""

    def timed_ms(self, model: Any) -> float:
        raise NotImplementedError

    @lpq.hookimpl
    def lpq_evaluate(self, framework, model, dataloader, postprocess, metrics, measurer, iteration):
        result = super().lpq_evaluate(
            framework, model, dataloader, postprocess, metrics, None, iteration
        )
        if result is not None and measurer is not None:
            measurer.samples.append(self.timed_ms(model) / 1e3)
        return result


def _true_ms(model: Any) -> float:
    return model.latency_ms() if isinstance(model, FakeQuantizedModel) else model.base_latency_ms


def _fit_four_convs(tmp_path: Any, max_trials: int) -> tuple[FakeModel, lpq.TuningResult]:
    """Tune four harmless convs (all int8 meets a 1% goal: 3 ms against fp32's 10 ms)."""
    ops = [(f"op{i}", "Conv") for i in range(4)]
    model = FakeModel(ops=ops, sensitivity={f"op{i}": 0.0002 for i in range(4)})
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(max_trials=max_trials),
    )
    return model, fit_fake(model, conf, tmp_path)


class _Drifting(_ScriptedLatency):
    """The machine slows down as the run goes on: every model runs ``1 + 3 * n`` times
    slower after the n-th quantization (other jobs arriving on a shared machine)."""

    def timed_ms(self, model: Any) -> float:
        return _true_ms(model) * (1 + 3 * self.calls.get("quantize", 0))


def test_trial_latency_is_compared_at_the_baselines_moment(lpq_plugin, tmp_path):
    lpq_plugin(_Drifting(tmp_path), name="fake")
    model, result = _fit_four_convs(tmp_path, max_trials=3)
    first = result.trials[0]
    # Timed after one quantization, everything runs 4x slower: the int8 model's raw time
    # (3 ms x 4 = 12 ms) is above the baseline's 10 ms, but fp32 timed right after it
    # reads 40 ms, so at the baseline's moment the int8 model takes 3 ms.
    truth = FakeQuantizedModel(model, first.config()).latency_ms()
    assert truth == pytest.approx(3.0)
    assert first.latency_ms == pytest.approx(truth)
    assert first.meets_goal and result.best.index == 0


class _FastOnlyOnce(_ScriptedLatency):
    """Int8 models read fast the first time they are timed (a lucky trial timing) and
    three times slower than fp32 every time after (the final side-by-side timing)."""

    def __init__(self, folder: Any) -> None:
        super().__init__(folder)
        self.timed_int8 = 0

    def timed_ms(self, model: Any) -> float:
        if not isinstance(model, FakeQuantizedModel):
            return _true_ms(model)
        self.timed_int8 += 1
        return _true_ms(model) if self.timed_int8 == 1 else 3 * model.source.base_latency_ms


def test_goal_not_met_when_the_chosen_model_is_slower_side_by_side(lpq_plugin, tmp_path):
    lpq_plugin(_FastOnlyOnce(tmp_path), name="fake")
    _, result = _fit_four_convs(tmp_path, max_trials=1)
    assert result.trials[0].meets_goal  # what the trial's own timing said
    assert result.best.latency_ms == pytest.approx(3 * result.baseline.latency_ms)
    assert not result.goal_met
    assert "slower than fp32 side by side" in result.stop_reason
