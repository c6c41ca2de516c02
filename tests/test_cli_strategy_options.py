"""`lpq tune --strategy-option KEY=VALUE`: reaches the strategy's factory, is recorded in the
run's history, and a key the strategy does not take is a clear error before any work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_cli_tuning import small_mlp

import lpq
from lpq.cli import main
from lpq.plugins.manager import get_plugin_manager

SEEN: list[dict[str, Any]] = []


class StrictStrategy(lpq.Strategy):
    """Takes exactly one option, ``step`` (an int), as a plugin strategy would declare it."""

    name = "strict-test"

    def __init__(self, *, step: int = 1) -> None:
        super().__init__(step=step)
        SEEN.append({"step": step})

    def propose(self, ctx: lpq.TuningContext) -> lpq.Proposals:
        yield [lpq.Candidate(ctx.space.default(), "default")]


class _Plugin:
    @lpq.hookimpl
    def lpq_register_strategies(self, register: Any) -> None:
        register("strict-test", StrictStrategy)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", input=rng.normal(size=(32, 16)).astype(np.float32))
    evals = rng.normal(size=(32, 16)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", input=evals)  # no labels: agreement with fp32
    return {
        "model": small_mlp(tmp_path / "mlp.onnx"),
        "calib": tmp_path / "calib.npz",
        "eval": tmp_path / "eval.npz",
    }


@pytest.fixture
def strict_strategy():
    pm = get_plugin_manager()
    pm.load()
    plugin = _Plugin()
    pm.register(plugin, name="strict-test-plugin")
    SEEN.clear()
    yield
    pm.unregister("strict-test-plugin")


def _argv(files: dict[str, Path], tmp_path: Path, *extra: str) -> list[str]:
    return [
        "tune",
        str(files["model"]),
        "--calib",
        str(files["calib"]),
        "--eval",
        str(files["eval"]),
        "--no-latency-aware",
        "--strategy",
        "strict-test",
        "--max-trials",
        "2",
        "--workspace",
        str(tmp_path / "ws"),
        "--out",
        str(tmp_path / "out.onnx"),
        *extra,
    ]


def test_strategy_option_reaches_the_factory_typed_and_is_recorded(
    files,
    tmp_path,
    capsys,
    strict_strategy,
):
    code = main(_argv(files, tmp_path, "--strategy-option", "step=3"))
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert SEEN and all(seen == {"step": 3} for seen in SEEN)  # YAML: 3 is an int
    history = json.loads(next((tmp_path / "ws").glob("*/history.json")).read_text())
    assert json.dumps(history).count('"step": 3') >= 1


def test_unknown_strategy_option_is_an_error_before_any_work(
    files,
    tmp_path,
    capsys,
    strict_strategy,
):
    code = main(_argv(files, tmp_path, "--strategy-option", "stride=3"))
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code != 0
    assert "strict-test" in text and "stride" in text and "Traceback" not in text
    assert not (tmp_path / "ws").exists()  # nothing was run or written
    assert not (tmp_path / "out.onnx").exists()


def test_malformed_strategy_option_names_the_flag(files, tmp_path, capsys):
    code = main(_argv(files, tmp_path, "--strategy-option", "nonsense"))
    captured = capsys.readouterr()
    assert code != 0
    assert "--strategy-option" in captured.out + captured.err


def test_a_builtin_strategy_refuses_an_option_it_does_not_read(files, tmp_path, capsys):
    argv = _argv(files, tmp_path, "--strategy-option", "fallback_rat=0.3")
    argv[argv.index("strict-test")] = "random"
    code = main(argv)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code != 0
    assert "fallback_rat" in text and "fallback_rate" in text  # the typo and the real name
    assert not (tmp_path / "ws").exists()


def test_a_builtin_strategy_takes_its_own_option(files, tmp_path, capsys):
    argv = _argv(files, tmp_path, "--strategy-option", "fallback_rate=0.5")
    argv[argv.index("strict-test")] = "random"
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
