"""Bad data is an error or a said warning, never a silent wrong answer (issue 29, items 3,
4 and 5): labels outside the model's classes, fractional labels, NaN/inf, array names
that do not match, a fixed batch of 1, a text file named .npz, a folder named .onnx."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from lpq.cli import main


@pytest.fixture(scope="module")
def digits() -> dict[str, Path]:
    from lpq_onnxrt.examples import digits_example

    return {k: Path(v) for k, v in digits_example().items() if k != "metric"}


@pytest.fixture(scope="module")
def eval_arrays(digits) -> tuple[np.ndarray, np.ndarray]:
    with np.load(digits["eval"]) as npz:
        return npz["input"], npz["labels"]


def _tune(capsys, digits, tmp_path, eval_path, *extra: str) -> tuple[int, str, str]:
    code = main(
        [
            "tune", str(digits["model"]), "--calib", str(digits["calib"]), "--eval",
            str(eval_path), "--workspace", str(tmp_path / "ws"), "--max-trials", "1",
            "--out", str(tmp_path / "q.onnx"), *extra,
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_labels_outside_the_class_range_are_refused_before_the_baseline(
    capsys, digits, eval_arrays, tmp_path
):
    x, y = eval_arrays
    path = tmp_path / "shifted.npz"
    np.savez(path, input=x, labels=y + 1)  # 1-based labels: 10 is out of range
    code, out, err = _tune(capsys, digits, tmp_path, path)
    assert code == 2
    assert "lie outside the model's 10 classes" in err and "0 to 9" in err
    assert "1-based" in err and "fp32 baseline" not in out


def test_fractional_labels_are_refused_for_top1_but_fine_for_mse(
    capsys, digits, eval_arrays, tmp_path
):
    x, y = eval_arrays
    path = tmp_path / "float.npz"
    np.savez(path, input=x, labels=y.astype(np.float32) + 0.5)
    code, _, err = _tune(capsys, digits, tmp_path, path)
    assert code == 2
    assert "are not whole numbers (e.g. " in err and "top1 reads labels as class indices" in err
    whole = tmp_path / "whole.npz"
    np.savez(whole, input=x, labels=y.astype(np.float32))  # whole numbers: fine
    assert _tune(capsys, digits, tmp_path, whole)[0] == 0


@pytest.mark.parametrize("which", ["eval", "calib"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_inf_in_data_are_refused(capsys, digits, eval_arrays, tmp_path, which, bad):
    x, y = eval_arrays
    x = x.copy()
    x[5, 0, 1, 1] = bad
    path = tmp_path / "bad.npz"
    if which == "eval":
        np.savez(path, input=x, labels=y)
        code, _, err = _tune(capsys, digits, tmp_path, path)
    else:
        np.savez(path, input=x)
        code = main(["quantize", str(digits["model"]), "--calib", str(path),
                     "--out", str(tmp_path / "q.onnx")])  # fmt: skip
        err = capsys.readouterr().err
    assert code == 2
    assert "array 'input' holds 1 non-finite value(s)" in err and "nan_to_num" in err


def test_an_array_name_that_is_no_model_input_is_used_by_position_and_said_once(
    capsys, digits, eval_arrays, tmp_path
):
    x, y = eval_arrays
    path = tmp_path / "named.npz"
    np.savez(path, data=x, labels=y)
    code, _, err = _tune(capsys, digits, tmp_path, path)
    assert code == 0
    said = "the array 'data' is not named after a model input; lpq feeds it to the model's only"
    assert err.count(said) == 1
    right = tmp_path / "right.npz"
    np.savez(right, input=x, labels=y)
    assert _tune(capsys, digits, tmp_path, right)[0] == 0
    assert "not named after a model input" not in capsys.readouterr().err


@pytest.fixture
def batch_of_one(digits, tmp_path) -> Path:
    model = onnx.load(digits["model"])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    path = tmp_path / "b1.onnx"
    onnx.save(model, path)
    return path


def test_a_fixed_batch_of_one_is_taken_with_a_note(capsys, digits, batch_of_one, tmp_path):
    code = main(["quantize", str(batch_of_one), "--calib", str(digits["calib"]),
                 "--out", str(tmp_path / "q.onnx")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "the model takes a fixed batch of 1 sample: reading" in err and "--batch-size 1" in err


def test_a_fixed_batch_of_one_with_an_explicit_batch_size_says_batch_size_1(
    capsys, digits, batch_of_one, tmp_path
):
    code = main(["quantize", str(batch_of_one), "--calib", str(digits["calib"]),
                 "--batch-size", "8", "--out", str(tmp_path / "q.onnx")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "fixed batch of 1 sample, and --batch-size is 8" in err and "--batch-size 1" in err
    assert "reshape" not in err


def test_a_text_file_named_npz_is_called_text(capsys, digits, tmp_path):
    text = tmp_path / "data.npz"
    text.write_text("1,2,3\n4,5,6\n")
    code = main(["quantize", str(digits["model"]), "--calib", str(text),
                 "--out", str(tmp_path / "q.onnx")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert f"{text} is not an .npz archive (it looks like text)" in err
    assert "pickle" not in err


def test_a_folder_named_onnx_is_called_a_folder(capsys, tmp_path):
    folder = tmp_path / "x.onnx"
    folder.mkdir()
    code = main(["quantize", str(folder), "--approach", "dynamic"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{folder} is a directory, lpq expected an ONNX model file" in err
    assert "in this form" not in err
