"""The worked metric plugin of docs/writing-a-metric.md: ``examples/lpq-example-metric``.

``rel_l2`` is checked against numpy, with labels and label-free (the fp32 outputs as
labels), pickled mid-evaluation, and used by name in ``lpq.fit``. The fake adaptor of
``lpq.testing`` turns reference outputs into class indices before its metrics see them,
so the tuning tests use a variant whose outputs are real values: the fp32 output is a
fixed signal, and a quantized model adds noise whose relative L2 norm is exactly the
model's scripted accuracy cost.
"""

from __future__ import annotations

import pickle
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from core_testutil import REPO, FakeSite, add_example_distribution, build_example_wheel
from packaging.requirements import Requirement

import lpq
from lpq.plugins.discovery import core_satisfies
from lpq.testing.fake_adaptor import FRAMEWORK, FakeAdaptorPlugin, FakeModel, FakeQuantizedModel

EXAMPLE = REPO / "examples" / "lpq-example-metric"
PROJECT = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
REQUIRES_CORE = next(r for r in PROJECT["dependencies"] if r.startswith("lpq-core"))

sys.path.insert(0, str(EXAMPLE))  # the package, as `pip install -e` would make it importable

from lpq_example_metric import plugin  # noqa: E402
from lpq_example_metric.relative_l2 import RelativeL2  # noqa: E402

RNG = np.random.default_rng(0)
SIGNAL = RNG.normal(size=(100, 4))
_noise = RNG.normal(size=(100, 4))
NOISE = _noise * np.linalg.norm(SIGNAL) / np.linalg.norm(_noise)  # as large as the signal
INPUTS = np.zeros((100, 1), np.float32)
CALIB = [INPUTS]


def reference(preds: list[np.ndarray], targets: list[np.ndarray]) -> float:
    """Relative L2 error over every value of every batch, the plain numpy way."""
    y = np.concatenate([p.ravel() for p in preds])
    t = np.concatenate([p.ravel() for p in targets])
    return float(np.linalg.norm(y - t) / np.linalg.norm(t))


# --------------------------------------------------------------------------- the metric


def test_it_matches_numpy_however_the_data_is_batched():
    preds, targets = RNG.normal(size=(30, 5)), RNG.normal(size=(30, 5))
    whole, batched = RelativeL2(), RelativeL2()
    whole.update(preds, targets)
    for start in range(0, 30, 8):
        batched.update(preds[start : start + 8], targets[start : start + 8])
    expected = reference([preds], [targets])
    assert whole.result() == pytest.approx(expected, rel=1e-12)
    assert batched.result() == pytest.approx(expected, rel=1e-12)
    assert (whole.name, whole.higher_is_better) == ("rel_l2", False)
    whole.reset()
    whole.update(targets, targets)
    assert whole.result() == 0.0, "reset forgets earlier batches"


def test_label_free_the_fp32_outputs_are_the_labels():
    # Without labels, lpq.fit passes the fp32 model's outputs (same structure as the
    # predictions: here a two-output model, so lists) as the labels.
    fp32 = [RNG.normal(size=(8, 3)), RNG.normal(size=(8, 2))]
    quantized = [fp32[0] + 0.01, fp32[1] - 0.02]
    metric = RelativeL2()
    metric.update(fp32, fp32)
    assert metric.result() == 0.0, "the fp32 baseline scores exactly 0"
    metric.reset()
    metric.update(quantized, fp32)
    assert metric.result() == pytest.approx(reference(quantized, fp32), rel=1e-12)
    second = RelativeL2(output=1)
    second.update(quantized, fp32)
    assert second.name == "rel_l2[1]"
    assert second.result() == pytest.approx(reference(quantized[1:], fp32[1:]), rel=1e-12)


def test_a_single_target_scores_the_first_output():
    outputs, target = [RNG.normal(size=(6, 1)), RNG.normal(size=(6, 9))], RNG.normal(size=6)
    metric = RelativeL2()
    metric.update(outputs, target)  # (6, 1) against (6,): the same values
    assert metric.result() == pytest.approx(reference(outputs[:1], [target]), rel=1e-12)


def test_what_it_cannot_score_is_a_data_error():
    with pytest.raises(lpq.DataError, match=r"shape \(4, 10\) but the targets have shape \(4,\)"):
        RelativeL2().update(np.zeros((4, 10)), np.arange(4))  # class indices
    with pytest.raises(lpq.DataError, match="needs targets"):
        RelativeL2().update(np.zeros((4, 10)), None)
    with pytest.raises(lpq.DataError, match="no output 2"):
        RelativeL2(output=2).update([np.zeros(3), np.zeros(3)], [np.zeros(3), np.zeros(3)])
    assert RelativeL2().result() == 0.0
    zeros = RelativeL2()
    zeros.update(np.ones(3), np.zeros(3))
    assert zeros.result() == float("inf")


def test_it_pickles_with_its_state():
    preds, targets = RNG.normal(size=(10, 3)), RNG.normal(size=(10, 3))
    metric = RelativeL2(output=0)
    metric.update(preds[:5], targets[:5])
    copy = pickle.loads(pickle.dumps(metric))
    assert type(copy) is RelativeL2 and copy.name == "rel_l2[0]"
    copy.update(preds[5:], targets[5:])
    assert copy.result() == pytest.approx(reference([preds], [targets]), rel=1e-12)
    assert pickle.loads(pickle.dumps(RelativeL2())).result() == 0.0


# --------------------------------------------------------------------------- in lpq.fit


class OutputsFakePlugin(FakeAdaptorPlugin):
    """The scripted fake adaptor with real-valued outputs (see the module docstring)."""

    @lpq.hookimpl
    def lpq_evaluate(
        self,
        framework: str,
        model: Any,
        dataloader: Any,
        postprocess: Any,
        metrics: Any,
        measurer: lpq.LatencyMeasurer | None,
        iteration: int | None,
    ) -> lpq.EvalResult | None:
        if framework != FRAMEWORK:
            return None
        if isinstance(model, FakeQuantizedModel):
            cost = model.source.base_accuracy - model.accuracy()
            latency = model.latency_ms()
        else:
            cost, latency = 0.0, model.base_latency_ms
        for metric in metrics:
            metric.reset()
        batches = 0
        for item in dataloader:
            inputs, labels = lpq.split_batch(item)
            n = len(inputs)
            for metric in metrics:
                metric.update(SIGNAL[:n] + cost * NOISE[:n], labels)
            batches += 1
        if measurer is not None:
            measurer.samples.append(latency / 1e3)
        return lpq.EvalResult(
            {m.name: m.result() for m in metrics},
            latency_ms=measurer.median_ms if measurer else None,
            batches=batches,
            samples=batches * len(INPUTS),
        )


def concentrated_model() -> FakeModel:
    ops = [(f"op{i}", "Conv" if i % 3 else "MatMul") for i in range(12)]
    sensitivity = {f"op{i}": 0.0005 for i in range(12)}
    sensitivity["op4"] = sensitivity["op9"] = 0.05
    return FakeModel(ops=ops, sensitivity=sensitivity)


@pytest.fixture
def registered(lpq_plugin, tmp_path: Path) -> None:
    lpq_plugin(OutputsFakePlugin(tmp_path), name="fake")
    lpq_plugin(plugin, name="example-metric")


def tune(data: list[Any], criterion: lpq.AccuracyCriterion, workspace: Path) -> lpq.TuningResult:
    conf = lpq.PostTrainingQuantConfig(accuracy_criterion=criterion)
    return lpq.fit(
        concentrated_model(),
        conf,
        CALIB,
        eval_dataloader=data,
        eval_metric="rel_l2",
        workspace=workspace,
    )


def test_fit_scores_by_name_without_labels(registered, tmp_path):
    # At most 1% relative error against the fp32 outputs: an absolute tolerance, since
    # the label-free baseline is 0.
    criterion = lpq.AccuracyCriterion(criterion="absolute", tolerable_loss=0.01)
    result = tune([INPUTS], criterion, tmp_path / "ws")
    assert result.metric == "rel_l2" and not result.higher_is_better
    assert result.baseline.accuracy == 0.0
    assert result.goal_met
    assert 0 < result.best.accuracy <= 0.01
    # The two ops that cost 0.05 each are the ones left in fp32.
    fallen = {name for (name, _), cfg in result.tune_cfg.ops.items() if not cfg.quantized}
    assert fallen == {"op4", "op9"}
    assert result.best.accuracy == pytest.approx(10 * 0.0005, rel=1e-9)


def test_fit_scores_by_name_with_targets(registered, tmp_path):
    offset = RNG.normal(size=SIGNAL.shape)
    targets = SIGNAL + 0.1 * offset * np.linalg.norm(SIGNAL) / np.linalg.norm(offset)
    criterion = lpq.AccuracyCriterion(tolerable_loss=0.05)  # relative: 5% of the baseline
    result = tune([(INPUTS, targets)], criterion, tmp_path / "ws")
    baseline = reference([SIGNAL], [targets])  # the fp32 model is about 10% off its targets
    assert result.baseline.accuracy == pytest.approx(baseline, rel=1e-9)
    assert result.goal_met
    assert result.best.accuracy <= baseline * 1.05


def test_a_relative_tolerance_of_a_zero_baseline_allows_nothing(registered, tmp_path):
    result = tune([INPUTS], lpq.AccuracyCriterion(tolerable_loss=0.01), tmp_path / "ws")
    assert result.baseline.accuracy == 0.0
    assert not result.goal_met


def test_class_index_labels_fail_before_any_trial(registered, tmp_path):
    criterion = lpq.AccuracyCriterion(criterion="absolute", tolerable_loss=0.01)
    with pytest.raises(lpq.DataError, match="targets have shape"):
        tune([(INPUTS, np.arange(100) % 10)], criterion, tmp_path / "ws")


# --------------------------------------------------------------------------- packaging


@pytest.fixture
def example_site(fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> FakeSite:
    """The example as an installed distribution: its real metadata, its folder on the path."""
    add_example_distribution(fake_site, EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return fake_site


@pytest.mark.xfail(
    not core_satisfies(REQUIRES_CORE.removeprefix("lpq-core")),
    reason=f"the example requires {REQUIRES_CORE}; this lpq-core is {lpq.__version__}",
    strict=True,
)
def test_the_example_is_found_through_its_entry_point(example_site: FakeSite) -> None:
    pm = lpq.get_plugin_manager()
    record = next(r for r in pm.records() if r.name == "example-metric")
    assert record.status.value == "ok", record.message
    assert record.distribution == "lpq-example-metric"
    assert record.hooks == ["lpq_register_metrics"]
    assert isinstance(pm.create_metric("rel_l2"), RelativeL2)


@pytest.mark.slow
def test_the_example_builds_a_wheel_with_its_entry_point(tmp_path: Path) -> None:
    wheel = build_example_wheel(EXAMPLE, tmp_path)
    assert "example-metric = lpq_example_metric.plugin" in wheel.entry_points
    assert Requirement(REQUIRES_CORE) in wheel.requires
    assert "lpq_example_metric/relative_l2.py" in wheel.names
