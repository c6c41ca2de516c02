"""What the CLI tells a user: true hints, the data set at fault, capability problems in file
order, help that answers, tables that keep names whole, progress and units (issue 11,
items 9, 11, 12, 13)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import click
import numpy as np
import pytest
from core_testutil import VALID

import lpq
from lpq.cli import main
from lpq.cli.tuning import _saved_history
from lpq.testing.fake_adaptor import FakeAdaptorPlugin, FakeModel


@pytest.fixture(scope="module")
def digits() -> dict[str, Path]:
    from lpq_onnxrt.examples import digits_example

    return {k: Path(v) for k, v in digits_example().items() if k != "metric"}


# ------------------------------------------------------------------ item 11: hints


@pytest.fixture
def fake(lpq_plugin, tmp_path: Path) -> FakeAdaptorPlugin:
    plugin = FakeAdaptorPlugin(tmp_path)
    lpq_plugin(plugin, name="fake")
    return plugin


@pytest.mark.parametrize("returned", [None, "0.9", np.array([0.5, 0.7])], ids=repr)
def test_an_eval_function_that_returns_no_number_is_named_as_such(fake, tmp_path, returned):
    with pytest.raises(lpq.TuningError) as info:
        lpq.fit(
            FakeModel(ops=[("a", "Conv")]),
            calib_dataloader=[np.zeros((2, 1), np.float32)],
            eval_func=lambda model: returned,
            workspace=tmp_path,
        )
    assert "the eval function returned" in info.value.message
    assert "not a number" in info.value.message
    assert "raised" not in info.value.message


def test_an_eval_function_that_raises_says_where_without_promising_a_history(fake, tmp_path):
    def broken(model):
        raise ZeroDivisionError("division by zero")

    with pytest.raises(lpq.TuningError) as info:
        lpq.fit(
            FakeModel(ops=[("a", "Conv")]),
            calib_dataloader=[np.zeros((2, 1), np.float32)],
            eval_func=broken,
            workspace=tmp_path / "ws",
        )
    assert "raised ZeroDivisionError: division by zero (at " in info.value.message
    assert "test_cli_messages.py:" in info.value.message
    assert "history" not in str(info.value) and "record" not in str(info.value)
    assert not (tmp_path / "ws").exists()


def test_an_interrupt_before_any_trial_says_nothing_was_saved(
    digits, tmp_path, capsys, monkeypatch
):
    import lpq.api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lpq.api, "fit", interrupted)
    workspace = tmp_path / "ws"
    code = main(
        [
            "tune",
            str(digits["model"]),
            "--calib",
            str(digits["calib"]),
            "--eval",
            str(digits["eval"]),
            "--workspace",
            str(workspace),
        ]
    )
    out = capsys.readouterr().out
    assert code == 130
    assert "no trial had finished, so nothing was saved" in out
    assert "saved in" not in out and not workspace.exists()


def test_an_interrupt_after_trials_names_the_history_file(tmp_path):
    started = time.time()
    run = tmp_path / "ws" / "run1"
    run.mkdir(parents=True)
    (run / "history.json").write_text(json.dumps({"trials": [{}, {}]}))
    assert _saved_history(str(tmp_path / "ws"), started) == (
        f"2 finished trial(s) are saved in {run / 'history.json'}; run the same command "
        "again to resume"
    )


def test_a_relative_loss_above_one_points_to_the_flag(digits, tmp_path, capsys):
    code = main(
        ["tune", str(digits["model"]), "--eval", str(digits["eval"]), "--tolerable-loss", "2"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "add --absolute" in err and "criterion=" not in err


@pytest.mark.parametrize("which", ["calib", "eval"])
def test_misfit_data_names_the_data_set_and_the_file_shape(digits, tmp_path, capsys, which):
    misfit = tmp_path / "misfit.npz"
    np.savez(misfit, input=np.zeros((70, 1, 10, 10), np.float32))
    files = {"calib": str(digits["calib"]), "eval": str(digits["eval"]), which: str(misfit)}
    code = main(
        [
            "tune",
            str(digits["model"]),
            "--calib",
            files["calib"],
            "--eval",
            files["eval"],
            "--workspace",
            str(tmp_path / "ws"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    name = {"calib": "calibration", "eval": "evaluation"}[which]
    assert f"error: the {name} data ({misfit}: (70, 1, 10, 10) float32): " in err
    assert "Traceback" not in err


# ------------------------------------------------------------------ item 12: validate


def test_capability_validate_lists_every_problem_in_file_order(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    text = VALID.replace("scheme: [sym]", "scheme: [symmetric]")
    text = text.replace(
        "  precisions: [int8, uint8, fp32]", "  precisions: [int8, uint8, fp32]\n  colour: red"
    )
    text = text.replace("dtype: [uint8]", "dtype: uint8")
    bad.write_text(text)
    good = tmp_path / "good.yaml"
    good.write_text(VALID)
    code = main(["capability", "validate", str(bad), str(good)])
    captured = capsys.readouterr()
    assert code == 2, "a user error, like every other"
    lines = captured.err.splitlines()
    assert lines[0].startswith(f"FAIL {bad}:4: at $[0].colour: unknown field 'colour'")
    assert lines[1].startswith(f"  also: {bad}:14: at $[0].capabilities.int8.static.Conv")
    assert "'symmetric' is not allowed" in lines[1]
    assert lines[2].startswith(f"  also: {bad}:17:") and "expected array" in lines[2]
    assert f"ok   {good}" in captured.out


# ------------------------------------------------------------------ item 13: help


def test_tune_help_describes_every_option(capsys):
    assert main(["tune", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for phrase in (
        "--max-trials INTEGER RANGE Most trials to run",
        "--seed INTEGER Seed of the strategy's random choices",
        "performance = lowest latency",
        "modelsize = smallest saved model",
        "footprint = lowest peak memory",
        "[default: MODEL-quantized.SUFFIX in the current folder",
        "Required for the static and auto approaches; dynamic and weight_only need none",
        "--eval FILE Evaluation data (.npz), always required",
    ):
        assert phrase in text, phrase
    for metric in ("top1", "accuracy", "top5", "f1", "mse", "cosine", "agreement"):
        assert re.search(rf"[ /]{metric}[ ,]", text), metric
    assert "latency is reported per batch of this many" in text


def test_every_tune_option_has_help():
    from lpq.cli.tuning import tune_command

    missing = [p.name for p in tune_command.params if isinstance(p, click.Option) and not p.help]
    assert missing == []


# ------------------------------------------------------------------ item 9: output


def test_piped_tables_keep_every_name_whole(run_lpq):
    result = run_lpq("capability", "show", "onnxrt")
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert "per_channel/per_tensor" in result.stdout  # a long cell on one line
    listing = run_lpq("plugins", "list")
    assert "…" not in listing.stdout and "lpq-onnxrt" in listing.stdout


def test_tune_shows_its_stages_and_states_the_latency_unit(digits, tmp_path, run_lpq):
    result = run_lpq(
        "tune", str(digits["model"]), "--calib", str(digits["calib"]), "--eval",
        str(digits["eval"]), "--workspace", str(tmp_path / "ws"), "--batch-size", "25",
        "--out", str(tmp_path / "q.onnx"), "--max-trials", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "evaluating the fp32 model: accuracy, then latency" in out
    assert out.index("evaluating the fp32 model") < out.index("trial  0")
    assert "latency (ms per batch of 25)" in out  # the table's column and the summary
    assert "latency (ms per batch of 25): " in out
    summary = json.loads(next((tmp_path / "ws").glob("*/summary.json")).read_text())
    assert summary["latency_batch_size"] == 25


def test_data_passes_are_reported_while_they_run(digits, tmp_path):
    from lpq.eval.watch import listening

    seen: list[tuple[str, int, int | None]] = []
    calib = lpq.load_npz(digits["calib"], batch_size=20)
    evaluation = lpq.load_npz(digits["eval"], batch_size=50)
    with listening(lambda stage, done, total: seen.append((stage, done, total))):
        lpq.fit(
            str(digits["model"]),
            lpq.PostTrainingQuantConfig(
                calibration_sampling_size=40,
                tuning_criterion=lpq.TuningCriterion(max_trials=1),
            ),
            calib,
            eval_dataloader=evaluation,
            workspace=tmp_path,
        )
    stages = {stage for stage, _, _ in seen}
    assert {"evaluation", "calibration"} <= stages
    calibration = [(done, total) for stage, done, total in seen if stage == "calibration"]
    assert (20, 40) in calibration and (40, 40) in calibration
    evaluated = max(done for stage, done, _ in seen if stage == "evaluation")
    assert evaluated == evaluation.num_samples


def test_quantize_counts_the_ops_the_model_runs_quantized(
    lpq_plugin, tmp_path, capsys, monkeypatch
):
    """The count comes from the converted model (lpq_quantized_ops), not from the plan."""
    import npq_adaptor

    npq = npq_adaptor.register_for_test(lpq_plugin, tmp_path, monkeypatch)

    class AllFloat:  # an adaptor that silently left every op in float
        @lpq.hookimpl
        def lpq_quantized_ops(self, framework, model):
            return {"fc1": "fp32", "fc2": "fp32"} if framework == "npq" else None

    pm = lpq_plugin(AllFloat(), name="all-float")
    rng = np.random.default_rng(0)
    weights = {"w1": rng.normal(size=(8, 16)), "w2": rng.normal(size=(16, 4))}
    model = pm.save_model("npq", npq.NpqModel(weights), tmp_path / "m")
    np.savez(tmp_path / "calib.npz", x=rng.normal(size=(16, 8)).astype(np.float32))
    code = main(
        [
            "quantize",
            str(model),
            "--calib",
            str(tmp_path / "calib.npz"),
            "--out",
            str(tmp_path / "q"),
        ]
    )
    err = capsys.readouterr().err
    # Nothing runs quantized: an error (exit 2), never an unquantized model with exit 0.
    assert code == 2
    assert "the configuration quantizes 2 op(s), but the converted model runs all of them" in err
    assert "nothing written" in err
    assert not (tmp_path / "q").exists()
