"""Executors with a real adaptor: the digits CNN (ONNX Runtime) tuned serially, in a local
process pool and on a local Ray cluster (loopback only) gives the same trials."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import lpq

pytest.importorskip("lpq_onnxrt", reason="the ONNX adaptor is part of the test environment")


def digits() -> lpq.Example:
    return lpq.get_plugin_manager().example("digits")


def tune(workspace: Path, **tuning: Any) -> lpq.TuningResult:
    example = digits()
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        tuning_criterion=lpq.TuningCriterion(
            strategy="random", max_trials=6, exit_policy="best", seed=3, **tuning
        ),
    )
    return lpq.fit(
        str(example.model),
        conf,
        lpq.load_npz(example.calib),
        eval_dataloader=lpq.load_npz(example.eval),
        workspace=workspace,
    )


def rows(result: lpq.TuningResult) -> list[tuple[Any, ...]]:
    return [
        (t.index, t.fingerprint, t.stage, t.status, None if t.status != "ok" else t.accuracy)
        for t in result.trials
    ]


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> lpq.TuningResult:
    return tune(tmp_path_factory.mktemp("serial"))


def test_process_pool_matches_serial_on_the_onnx_digits_model(serial, tmp_path):
    pooled = tune(tmp_path, workers=2, executor="process")
    assert len(serial.trials) == 6
    assert rows(pooled) == rows(serial)
    assert any(t.worker for t in pooled.trials), "no trial ran in a worker"


def test_ray_with_two_workers_matches_serial(serial, tmp_path):
    pytest.importorskip("ray")
    ray_run = tune(tmp_path, workers=2, executor="ray")
    assert rows(ray_run) == rows(serial)
    assert any(t.worker.startswith("ray") for t in ray_run.trials), "no trial ran on Ray"


def test_cli_workers_flag_runs_trials_in_worker_processes(tmp_path, capsys):
    import json

    from lpq.cli import main

    argv = ["tune", "--example", "digits", "--workers", "2", "--strategy", "random"]
    argv += ["--max-trials", "5", "--exit-policy", "best", "--seed", "3"]
    argv += ["--workspace", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().out
    history = json.loads(next(tmp_path.glob("*/history.json")).read_text())
    assert len(history["trials"]) == 5
    assert any(t["worker"].startswith("pid") for t in history["trials"])
    assert history["config"]["tuning_criterion"]["workers"] == 2


def test_unknown_executor_names_the_installed_ones(tmp_path, capsys):
    from lpq.cli import main

    code = main(
        ["tune", "--example", "digits", "--executor", "slurm", "--workspace", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown executor 'slurm'" in err and "process, ray, serial" in err
