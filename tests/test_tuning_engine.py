"""The tuning engine: executors, trial ids, history that never loses a trial, resume.

Strategies propose batches; the driver runs them serially or in worker processes. The
fake adaptor makes every trial's result exact, so serial and parallel runs can be
compared record by record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lpq
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel, FakeQuantizedModel

EVAL = [(np.zeros((100, 1), np.float32), np.arange(100) % 10)]
CALIB = [np.zeros((100, 1), np.float32)]


def spread_model(n: int = 12) -> FakeModel:
    """Damage spread over every op: strategies must walk many batches of trials."""
    ops = [(f"op{i}", "Conv" if i % 3 else "MatMul") for i in range(n)]
    return FakeModel(ops=ops, sensitivity={f"op{i}": 0.004 + 0.001 * (i % 4) for i in range(n)})


def conf(strategy: str = "basic", **tuning: Any) -> lpq.PostTrainingQuantConfig:
    return lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(strategy=strategy, **tuning),
    )


def fit(model: Any, config: lpq.PostTrainingQuantConfig, workspace: Path, **kw: Any):
    return lpq.fit(model, config, CALIB, eval_dataloader=EVAL, workspace=workspace, **kw)


def trial_rows(result: lpq.TuningResult) -> list[tuple[Any, ...]]:
    return [
        (t.index, t.fingerprint, t.stage, t.status, round(t.accuracy, 9), t.latency_ms)
        for t in result.trials
    ]


@pytest.mark.parametrize("strategy", ["basic", "auto", "random", "exhaustive"])
def test_serial_and_process_pool_runs_give_identical_histories(lpq_plugin, tmp_path, strategy):
    lpq_plugin(FakeAdaptorPlugin(tmp_path), name="fake")
    budget = {"max_trials": 12, "exit_policy": "best", "seed": 7}
    serial = fit(spread_model(), conf(strategy, **budget), tmp_path / "serial")
    pooled = fit(
        spread_model(), conf(strategy, workers=2, executor="process", **budget), tmp_path / "pool"
    )
    assert len(serial.trials) == 12
    assert trial_rows(pooled) == trial_rows(serial)
    assert pooled.best.index == serial.best.index
    assert {t.worker for t in pooled.trials if t.worker}, "some trials ran in worker processes"


class DyingAdaptor(FakeAdaptorPlugin):
    """Kills the worker process while quantizing chosen configs: ``once`` dies on the first
    attempt only (a marker file remembers it), ``always`` on every attempt."""

    def __init__(self, folder: Path, once: str, always: str) -> None:
        super().__init__(folder)
        self.folder, self.once, self.always = Path(folder), once, always

    @lpq.hookimpl
    def lpq_quantize(self, framework, model, tune_cfg, calib_dataloader, train_func):
        if framework != "fake":
            return None
        fallen = {name for (name, _), c in tune_cfg.ops.items() if not c.quantized}
        marker = self.folder / "died-once"
        in_worker = os.getpid() != self.driver_pid
        if in_worker and fallen == {self.always}:
            os._exit(3)
        if in_worker and fallen == {self.once} and not marker.exists():
            marker.write_text("x")
            os._exit(3)
        return FakeQuantizedModel(model, tune_cfg)


def test_a_dead_worker_is_retried_once_then_its_trial_recorded_as_failed(lpq_plugin, tmp_path):
    plugin = DyingAdaptor(tmp_path, once="op1", always="op2")
    plugin.driver_pid = os.getpid()
    lpq_plugin(plugin, name="fake")
    config = conf("basic", workers=2, executor="process", max_trials=30, exit_policy="best")
    result = fit(spread_model(6), config, tmp_path / "ws")
    by_fallen = {}
    for trial in result.trials:
        cfg = trial.config()
        fallen = {name for (name, _), c in cfg.ops.items() if not c.quantized}
        if len(fallen) == 1 and trial.stage == "fallback op by op":
            by_fallen[next(iter(fallen))] = trial
    assert by_fallen["op1"].status == "ok" and by_fallen["op1"].attempts == 2
    assert by_fallen["op2"].status == "error" and by_fallen["op2"].attempts == 2
    assert "died" in by_fallen["op2"].error
    # Trials in flight when a worker died are retried one at a time: only the culprit fails.
    assert all(by_fallen[f"op{i}"].status == "ok" for i in (0, 3, 4, 5))
    history = json.loads(result.history_path.read_text())
    assert [t["index"] for t in history["trials"]] == list(range(len(result.trials)))


def test_interrupted_rerun_never_shrinks_the_history(lpq_plugin, tmp_path):
    """Issue: Ctrl-C during the replay of finished trials rewrote history with only the
    trials replayed so far (8 -> 3)."""
    lpq_plugin(FakeAdaptorPlugin(tmp_path), name="fake")
    config = conf("basic", max_trials=8, exit_policy="best")
    first = fit(spread_model(), config, tmp_path / "ws")
    assert len(first.trials) == 8
    seen = []

    def interrupt_during_replay(record: lpq.TrialRecord) -> None:
        seen.append(record)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(spread_model(), config, tmp_path / "ws", on_trial=interrupt_during_replay)
    history = json.loads(first.history_path.read_text())
    assert len(history["trials"]) == 8
    again = fit(spread_model(), config, tmp_path / "ws")
    assert trial_rows(again) == trial_rows(first)
    assert all(t.resumed for t in again.trials)


def test_a_larger_budget_continues_the_same_run(lpq_plugin, tmp_path):
    plugin = FakeAdaptorPlugin(tmp_path)
    lpq_plugin(plugin, name="fake")
    short = fit(spread_model(), conf("basic", max_trials=4, exit_policy="best"), tmp_path / "ws")
    quantized_before = plugin.calls["quantize"]
    longer = fit(spread_model(), conf("basic", max_trials=9, exit_policy="best"), tmp_path / "ws")
    assert longer.history_path == short.history_path
    assert [t.index for t in longer.trials] == list(range(9))
    assert all(t.resumed for t in longer.trials[:4])
    assert not any(t.resumed for t in longer.trials[4:])
    assert plugin.calls["quantize"] - quantized_before == 5  # only the new trials ran


def test_a_killed_driver_resumes_without_repeating_a_finished_trial(tmp_path):
    script = tmp_path / "tune.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal, sys
            import numpy as np
            import lpq
            from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel

            class Killer(FakeAdaptorPlugin):
                @lpq.hookimpl
                def lpq_evaluate(self, framework, model, dataloader, postprocess, metrics,
                                 measurer, iteration):
                    out = super().lpq_evaluate(framework, model, dataloader, postprocess,
                                               metrics, measurer, iteration)
                    if metrics and hasattr(model, "tune_cfg"):  # a trial's accuracy pass
                        with open({str(tmp_path / "evaluated.log")!r}, "a") as log:
                            log.write(model.tune_cfg.fingerprint() + "\\n")
                        if self.calls["evaluate"] >= int(sys.argv[1]) > 0:
                            os.kill(os.getpid(), signal.SIGKILL)
                    return out

            lpq.get_plugin_manager().register(Killer({str(tmp_path)!r}), name="fake")
            ops = [(f"op{{i}}", "Conv") for i in range(10)]
            model = FakeModel(ops=ops, sensitivity={{f"op{{i}}": 0.005 for i in range(10)}})
            conf = lpq.PostTrainingQuantConfig(
                tuning_criterion=lpq.TuningCriterion(strategy="basic", max_trials=10,
                                                     exit_policy="best"))
            lpq.fit(model, conf, [np.zeros((4, 1), np.float32)],
                    eval_dataloader=[(np.zeros((100, 1), np.float32), np.arange(100) % 10)],
                    workspace={str(tmp_path / "ws")!r})
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run([sys.executable, str(script), "12"], env=env, check=False)
    assert killed.returncode == -signal.SIGKILL
    history = json.loads(next((tmp_path / "ws").glob("*/history.json")).read_text())
    finished = {t["fingerprint"] for t in history["trials"]}
    evaluated_first = (tmp_path / "evaluated.log").read_text().split()
    assert finished and len(finished) == len(evaluated_first) - 1  # the last was in flight
    subprocess.run([sys.executable, str(script), "0"], env=env, check=True)
    second_run = (tmp_path / "evaluated.log").read_text().split()[len(evaluated_first) :]
    assert second_run, "the re-run went on tuning"
    assert not finished & set(second_run), "a finished trial ran again"
    history = json.loads(next((tmp_path / "ws").glob("*/history.json")).read_text())
    assert len(history["trials"]) == 10
    assert not list((tmp_path / "ws").glob("*/.history.json.*.tmp"))


class SlowInt8Adaptor(FakeAdaptorPlugin):
    """Quantized models run *slower* than fp32 (as tiny MatMuls often do in int8)."""

    @lpq.hookimpl
    def lpq_evaluate(self, framework, model, dataloader, postprocess, metrics, measurer, iteration):
        result = super().lpq_evaluate(
            framework, model, dataloader, postprocess, metrics, None, iteration
        )
        if result is not None and measurer is not None:
            slow = 13.0 if isinstance(model, FakeQuantizedModel) else 10.0
            measurer.samples.append(slow / 1e3)
            result.latency_ms = measurer.median_ms
        return result


def test_a_candidate_slower_than_fp32_does_not_meet_a_performance_goal(lpq_plugin, tmp_path):
    lpq_plugin(SlowInt8Adaptor(tmp_path), name="fake")
    model = FakeModel(ops=[("op0", "Conv"), ("op1", "MatMul")])
    result = fit(model, conf("auto", max_trials=4), tmp_path / "ws")
    assert result.best.accuracy == pytest.approx(0.9)
    assert not result.goal_met, "1.3x slower than fp32 must not count as meeting the goal"
    size_goal = conf("auto", max_trials=4, objective="modelsize")
    assert fit(model, size_goal, tmp_path / "ws2").goal_met


def test_written_files_keep_normal_permissions_and_stale_temporaries_go(lpq_plugin, tmp_path):
    lpq_plugin(FakeAdaptorPlugin(tmp_path), name="fake")
    previous = os.umask(0o022)
    try:
        stale = tmp_path / "ws"
        first = fit(spread_model(), conf("auto", max_trials=2), stale)
        leftover = first.history_path.parent / ".history.json.abc123.tmp"
        leftover.write_text("{ truncated")  # what a SIGKILL mid-write leaves behind
        fit(spread_model(), conf("auto", max_trials=2), stale)
    finally:
        os.umask(previous)
    assert oct(first.history_path.stat().st_mode & 0o777) == oct(0o644)
    assert not leftover.exists()


def test_reported_speedup_is_remeasured_side_by_side_at_the_end(lpq_plugin, tmp_path):
    plugin = FakeAdaptorPlugin(tmp_path)
    lpq_plugin(plugin, name="fake")
    result = fit(spread_model(), conf("auto", max_trials=3), tmp_path / "ws")
    history = json.loads(result.history_path.read_text())
    final = history["final_latency"]
    assert final["how"].startswith("interleaved")
    summary = result.summary()
    assert summary["baseline_latency_ms"] == final["baseline_ms"]
    assert summary["final_latency_ms"] == final["chosen_ms"]
    assert summary["latency_speedup"] == pytest.approx(final["baseline_ms"] / final["chosen_ms"])


class BrokenInspection(FakeAdaptorPlugin):
    """Inspection dies with a raw framework error (as torchao's IndexError did on MiniLM)."""

    @lpq.hookimpl
    def lpq_inspect_tensor(self, framework, model, dataloader, op_names, kind, iteration):
        if framework != "fake":
            return None
        raise IndexError("list index out of range")


def test_a_raw_error_while_inspecting_never_ends_tuning(lpq_plugin, tmp_path, caplog):
    lpq_plugin(BrokenInspection(tmp_path), name="fake")
    ops = [(f"op{i}", "Conv") for i in range(6)]
    model = FakeModel(ops=ops, sensitivity={"op0": 0.0001, "op3": 0.05})
    result = fit(model, conf("auto", max_trials=12), tmp_path / "ws")
    assert result.goal_met, "ranked by trials instead"
    assert "op3" in {n for (n, _), c in result.tune_cfg.ops.items() if not c.quantized}
    assert "IndexError" in caplog.text and "ranking ops with trials instead" in caplog.text


class FloatInDisguise(FakeAdaptorPlugin):
    """Reports (lpq_quantized_ops) that the converted model runs every op in fp32, as ORT
    does with a lone quantized Concat or Sigmoid."""

    @lpq.hookimpl
    def lpq_quantized_ops(self, framework, model):
        if framework != "fake":
            return None
        return {name: "fp32" for name, _ in model.source.ops}


def test_a_model_that_really_runs_all_fp32_never_meets_the_goal(lpq_plugin, tmp_path):
    lpq_plugin(FloatInDisguise(tmp_path), name="fake")
    result = fit(spread_model(4), conf("auto", max_trials=4), tmp_path / "ws")
    assert all(t.counts_from == "model" and t.quantized_ops == 0 for t in result.trials)
    assert not result.goal_met
