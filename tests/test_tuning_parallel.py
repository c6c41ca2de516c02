"""Parallel trials that really overlap: per-run state warmed once before any worker
exists, latency timed only for candidates that can be the answer, workers on their own
cores, and on Ray one latency gate per node."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel, FakeQuantizedModel
from lpq.tuning.gate import Gate, Pinned, machine_cores, share_of

EVAL = [(np.zeros((100, 1), np.float32), np.arange(100) % 10)]
CALIB = [np.zeros((4, 1), np.float32)]


def model(n: int = 8) -> FakeModel:
    """op0 alone breaks the goal: the walk sees candidates on both sides of it."""
    ops = [(f"op{i}", "Conv" if i % 3 else "MatMul") for i in range(n)]
    return FakeModel(ops=ops, sensitivity={f"op{i}": 0.05 if i == 0 else 0.001 for i in range(n)})


def fit(workspace: Path, strategy: str = "basic", **tuning: Any) -> lpq.TuningResult:
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.02),
        tuning_criterion=lpq.TuningCriterion(
            strategy=strategy, exit_policy="best", seed=5, **tuning
        ),
    )
    return lpq.fit(model(), conf, CALIB, eval_dataloader=EVAL, workspace=workspace)


class CountingAdaptor(FakeAdaptorPlugin):
    """Logs every latency pass (pid, accurate?) and every 'calibration statistics'
    compute (pid, algorithm), the statistics kept in the run cache per algorithm."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.folder = Path(folder)

    def _log(self, name: str, line: str) -> None:
        with open(self.folder / name, "a") as log:
            log.write(line + "\n")

    def lines(self, name: str) -> list[str]:
        path = self.folder / name
        return path.read_text().splitlines() if path.exists() else []

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework != "fake":
            return None
        algorithms = sorted(
            {c.activation.algorithm for c in tune_cfg.ops.values() if c.quantized and c.activation}
        )
        for algorithm in algorithms:
            lpq.run_cache().get_or_compute(
                "fake-statistics",
                lpq.content_key(model.ops, algorithm),
                lambda algorithm=algorithm: self._log("calibrated", f"{os.getpid()} {algorithm}"),
            )
        return FakeQuantizedModel(model, tune_cfg)

    @lpq.hookimpl
    def lpq_evaluate(self, framework, model, dataloader, postprocess, metrics, measurer, iteration):
        if framework == "fake" and measurer is not None and isinstance(model, FakeQuantizedModel):
            self._log("timed", model.tune_cfg.fingerprint())
        return super().lpq_evaluate(
            framework, model, dataloader, postprocess, metrics, measurer, iteration
        )


def test_a_candidate_that_misses_the_accuracy_goal_gets_no_latency_pass(lpq_plugin, tmp_path):
    plugin = CountingAdaptor(tmp_path)
    lpq_plugin(plugin, name="fake")
    result = fit(tmp_path / "ws", max_trials=10)
    ok = [t for t in result.trials if t.status == "ok"]
    accurate = [t for t in ok if t.accuracy >= result.baseline.accuracy * 0.98 - 1e-12]
    assert accurate and len(accurate) < len(ok), "the walk must see both kinds"
    assert all(t.latency_ms is not None for t in accurate)
    assert all(t.latency_ms is None for t in ok if t not in accurate)
    timed = plugin.lines("timed")
    assert sorted(set(timed)) == sorted(t.fingerprint for t in accurate)


def test_the_answer_is_timed_even_when_no_candidate_met_the_goal(lpq_plugin, tmp_path):
    plugin = CountingAdaptor(tmp_path)
    lpq_plugin(plugin, name="fake")
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=1e-9),
        tuning_criterion=lpq.TuningCriterion(strategy="random", max_trials=4, exit_policy="best"),
    )
    result = lpq.fit(model(), conf, CALIB, eval_dataloader=EVAL, workspace=tmp_path / "ws")
    assert not result.goal_met
    others = [t.latency_ms for t in result.trials if t.index != result.best.index]
    assert others == [None] * (len(result.trials) - 1)
    assert result.best.latency_ms is not None
    assert result.summary()["latency_speedup"] is not None


def test_every_calibration_algorithm_is_computed_once_in_the_driver(lpq_plugin, tmp_path):
    plugin = CountingAdaptor(tmp_path)
    lpq_plugin(plugin, name="fake")
    result = fit(tmp_path / "ws", "random", max_trials=9, workers=2, executor="process")
    assert any(t.worker for t in result.trials), "trials ran in worker processes"
    computed = [line.split() for line in plugin.lines("calibrated")]
    assert sorted(algorithm for _, algorithm in computed) == ["kl", "minmax"]
    assert {int(pid) for pid, _ in computed} == {os.getpid()}, "not in a worker"
    history = json.loads(result.history_path.read_text())
    assert set(history["timing"]) == {"began", "prepare_s", "trials_s"}


def test_warm_up_and_latency_rule_keep_serial_and_pool_identical(lpq_plugin, tmp_path):
    lpq_plugin(CountingAdaptor(tmp_path), name="fake")

    def rows(result: lpq.TuningResult) -> list[tuple[Any, ...]]:
        return [(t.index, t.fingerprint, t.accuracy, t.latency_ms) for t in result.trials]

    serial = fit(tmp_path / "serial", "random", max_trials=9)
    pooled = fit(tmp_path / "pool", "random", max_trials=9, workers=2, executor="process")
    assert rows(pooled) == rows(serial)
    assert pooled.best.index == serial.best.index


def test_shares_of_cores_are_disjoint_while_there_are_enough():
    cores = [0, 1, 2, 3, 4]
    shares = [share_of(slot, 2, cores) for slot in range(2)]
    assert shares == [[0, 1], [2, 3, 4]]
    assert [share_of(slot, 3, [0, 1]) for slot in range(3)] == [[0], [1], [0]]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity calls")
def test_a_pinned_worker_measures_latency_on_every_core_and_goes_back():
    every = machine_cores()
    try:
        gate = Pinned(Gate(), every[:1], every)
        assert sorted(os.sched_getaffinity(0)) == every[:1]
        with gate.exclusive():
            assert sorted(os.sched_getaffinity(0)) == every
        assert sorted(os.sched_getaffinity(0)) == every[:1]
        with gate.shared():
            assert sorted(os.sched_getaffinity(0)) == every[:1]
    finally:
        os.sched_setaffinity(0, set(every))


def test_ray_has_one_gate_per_node_and_frees_what_a_dead_worker_held(tmp_path):
    ray = pytest.importorskip("ray")
    from lpq.tuning.ray_executor import RayExecutor
    from lpq.tuning.runner import Evaluation, TrialRunner

    executor = RayExecutor(workers=2)
    try:
        runner = TrialRunner("fake", None, None, Evaluation("fake"), measure_size=False)
        runner.cache_dir = tmp_path / "cache"
        executor.start(runner)
        executor._ensure_workers()
        nodes = set(executor.placement.values())
        assert len(nodes) == 1 and set(executor.gates) == nodes  # the local head only
        if len(machine_cores()) >= 2:
            assert not set(executor.cores[0]) & set(executor.cores[1]), executor.cores
        gate = executor.gates[nodes.pop()]
        ray.get(gate.enter.remote("gone", "exclusive"))
        ray.get(gate.release.remote("gone"))  # what the executor does when a worker dies
        ready, _ = ray.wait([gate.enter.remote("next", "shared")], timeout=120)
        assert ready, "the dead holder's exclusive slot was not given back"
    finally:
        executor.close()
