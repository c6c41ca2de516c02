"""What a new user must not lose or wait for (issue 29, items 1, 6, 7, 8): an --out that is
an input is refused, unwritable outputs and malformed histories are clear errors without a
traceback, and mistakes are caught before the fp32 model is evaluated."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lpq.cli import main


@pytest.fixture(scope="module")
def digits() -> dict[str, Path]:
    from lpq_onnxrt.examples import digits_example

    return {k: Path(v) for k, v in digits_example().items() if k != "metric"}


@pytest.fixture
def model(digits, tmp_path) -> Path:
    """A private copy of the digits model (tests may try to overwrite it)."""
    copy = tmp_path / "m.onnx"
    copy.write_bytes(digits["model"].read_bytes())
    return copy


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------ item 1: overwrite


@pytest.mark.parametrize("alias", ["same", "symlink", "hardlink"])
def test_quantize_refuses_to_overwrite_its_input_model(capsys, digits, model, alias):
    before = model.read_bytes()
    out = model
    if alias == "symlink":
        out = model.parent / "link.onnx"
        out.symlink_to(model)
    elif alias == "hardlink":
        out = model.parent / "hard.onnx"
        os.link(model, out)
    code, _, err = _run(
        capsys, "quantize", str(model), "--calib", str(digits["calib"]), "--out", str(out)
    )
    assert code == 2
    assert "would overwrite a file this run reads" in err and "--force" in err
    assert "Traceback" not in err
    assert model.read_bytes() == before


def test_tune_refuses_an_out_that_is_its_eval_data_before_any_work(capsys, digits, model, tmp_path):
    data = tmp_path / "eval.npz"
    data.write_bytes(digits["eval"].read_bytes())
    before = data.read_bytes()
    code, out, err = _run(
        capsys,
        "tune", str(model), "--calib", str(digits["calib"]), "--eval", str(data),
        "--out", str(data), "--workspace", str(tmp_path / "ws"),
    )  # fmt: skip
    assert code == 2 and "the --eval data" in err
    assert "fp32 baseline" not in out  # refused before the model ran
    assert data.read_bytes() == before and not (tmp_path / "ws").exists()


def test_force_overwrites_the_input_on_purpose(capsys, digits, model):
    before = model.read_bytes()
    code, _, _ = _run(
        capsys, "quantize", str(model), "--calib", str(digits["calib"]), "--out", str(model),
        "--force",
    )  # fmt: skip
    assert code == 0 and model.read_bytes() != before


# ------------------------------------------------------------------ item 6: no tracebacks


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("{model}/q.onnx", "is a file, not a folder"),
        ("/proc/lpq-test/q.onnx", "may not create files in /proc"),
        ("{tmp}/" + "n" * 300 + ".onnx", "longer than the file system allows"),
        ("{tmp}", "is a folder"),
    ],
    ids=["parent-is-file", "proc", "name-too-long", "folder"],
)
def test_unwritable_out_is_one_clear_message(capsys, digits, model, tmp_path, out, message):
    out = out.format(model=model, tmp=tmp_path)
    code, _, err = _run(
        capsys, "quantize", str(model), "--calib", str(digits["calib"]), "--out", out
    )
    assert code == 2, err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "content",
    ['[1, 2]', '{"run_key": "KEY", "trials": {"a": 1}}', '{"run_key": "KEY", "trials": [1]}',
     '{"run_key": "KEY", "trials": [{"index": "x", "stage": "s", "tune_cfg": null}]}'],
    ids=["list", "trials-dict", "trial-int", "trial-bad-index"],
)  # fmt: skip
def test_a_history_of_the_wrong_structure_is_refused_and_left_untouched(
    capsys, digits, model, tmp_path, content
):
    workspace = tmp_path / "ws"
    argv = [
        "tune", str(model), "--calib", str(digits["calib"]), "--eval", str(digits["eval"]),
        "--workspace", str(workspace), "--max-trials", "1", "--out", str(tmp_path / "q.onnx"),
    ]  # fmt: skip
    assert _run(capsys, *argv)[0] == 0
    (history,) = workspace.glob("*/history.json")
    run_key = json.loads(history.read_text())["run_key"]
    broken = content.replace("KEY", run_key)
    history.write_text(broken)
    code, _, err = _run(capsys, *argv)
    assert code == 2, err
    assert "is unreadable" in err and "left it as it is" in err and "Traceback" not in err
    assert history.read_text() == broken


# ------------------------------------------------------------------ item 7: early checks


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--strategy", "nope"], "unknown strategy"),
        (["--executor", "nope"], "unknown executor"),
        (["--backend", "nope"], "unknown backend profile"),
        (["--metric", "nope"], "unknown metric"),
        (["--approach", "static", "--no-calib"], "no --calib was given"),
        (["--out", "/proc/lpq-test/q.onnx"], "may not create files"),
    ],
)
def test_mistakes_fail_before_the_fp32_model_runs(capsys, digits, model, tmp_path, extra, message):
    calib = [] if "--no-calib" in extra else ["--calib", str(digits["calib"])]
    extra = [e for e in extra if e != "--no-calib"]
    code, out, err = _run(
        capsys, "tune", str(model), *calib, "--eval", str(digits["eval"]),
        "--workspace", str(tmp_path / "ws"), *extra,
    )  # fmt: skip
    assert code == 2 and message in err
    assert "fp32 baseline" not in out and "evaluating the fp32" not in out


def test_data_of_the_wrong_shape_fails_on_one_batch(capsys, digits, model, tmp_path):
    import numpy as np

    misfit = tmp_path / "misfit.npz"
    np.savez(misfit, input=np.zeros((64, 1, 9, 9), np.float32))
    code, out, err = _run(
        capsys, "tune", str(model), "--calib", str(misfit), "--eval", str(digits["eval"]),
        "--workspace", str(tmp_path / "ws"),
    )  # fmt: skip
    assert code == 2
    assert "the calibration data (" in err and "misfit.npz" in err and "shape" in err
    assert "fp32 baseline" not in out


def test_unknown_option_keys_are_checked_where_the_adaptor_lists_them(monkeypatch):
    from lpq.cli.checks import check_options
    from lpq.errors import ConfigError

    class Info:
        known_options = ("latency_batch_size", "quant_format")

    class PM:
        def adaptor(self, framework):
            return Info()

    check_options(PM(), "x", {"latency_batch_size": 8, "latency_aware": True}, None)
    with pytest.raises(ConfigError) as info:
        check_options(PM(), "x", {"latency_batsh_size": 8}, None)
    assert "latency_batsh_size" in info.value.message
    assert "latency_batch_size" in (info.value.hint or "")


def test_workers_above_the_core_count_are_capped_with_a_note(capsys, digits, model, tmp_path):
    cores = os.cpu_count() or 1
    code, _, err = _run(
        capsys, "tune", str(model), "--calib", str(digits["calib"]), "--eval", str(digits["eval"]),
        "--workspace", str(tmp_path / "ws"), "--max-trials", "1", "--workers", str(cores + 3),
        "--out", str(tmp_path / "q.onnx"),
    )  # fmt: skip
    assert code == 0
    assert f"--workers {cores + 3} is more than this machine's {cores} CPU core(s)" in err


# ------------------------------------------------------------------ item 8: output


def test_example_writes_model_summary_history_and_plot_into_one_run_folder(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(
        capsys, "tune", "--example", "digits", "--workspace", str(tmp_path / "ws"),
        "--max-trials", "2",
    )  # fmt: skip
    assert code == 0
    (summary_path,) = (tmp_path / "ws").glob("*/summary.json")
    folder = summary_path.parent
    summary = json.loads(summary_path.read_text())
    assert Path(summary["model"]).parent == folder and Path(summary["model"]).is_file()
    assert (folder / "history.json").is_file()
    assert f"run folder: {folder}" in out
    assert "float ops" in out  # the column of ops left in float, not a second "fp32"
    assert not (tmp_path / "ws" / "example-digits").exists()


def test_plugins_list_says_what_a_plugin_without_its_framework_can_do(capsys, monkeypatch):
    import lpq.cli as cli_module

    class Record:
        status = type("S", (), {"value": "ok"})()
        frameworks = [{"framework": "mxnet", "distribution": "mxnet", "installed": None}]

    assert cli_module._status_text(Record()) == "ok (mxnet not installed: cannot quantize)"
    Record.frameworks = [{"framework": "onnxrt", "distribution": "onnxruntime", "installed": "1"}]
    assert cli_module._status_text(Record()) == "ok"


def test_a_misspelt_onnxrt_option_fails_before_any_work(capsys, digits, model, tmp_path):
    """lpq-onnxrt lists the option keys it reads: a typo is an error naming the known ones."""
    code, _, err = _run(
        capsys, "quantize", str(model), "--calib", str(digits["calib"]),
        "--out", str(tmp_path / "q.onnx"), "--option", "latency_margn=0.05",
    )  # fmt: skip
    assert code == 2
    assert "unknown --option key(s) for the onnxrt adaptor: latency_margn" in err
    assert "latency_margin" in err
    assert not (tmp_path / "q.onnx").exists()
