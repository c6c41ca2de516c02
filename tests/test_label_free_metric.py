"""Label-free tuning works for any output shape (issue 11, item 7).

A text recognizer (output [N, T, C]) tuned without labels failed with "32 predictions but
8480000 labels in a batch" although the user gave no labels. Without labels lpq now
compares with the fp32 outputs position by position (class scores) or by cosine
similarity (anything else), and says which.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import lpq
from lpq.cli import main
from lpq.eval.metric_choice import label_free_metric
from lpq.eval.metrics import Agreement, CosineSimilarity, TopK


def matmul_model(
    path: Path, out_shape: list, weight: np.ndarray, in_shape: list, output: str = "y"
) -> Path:
    """input @ weight, with the given symbolic shapes (a sequence model when 3-D) and the
    output named ``output``."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], [output], name="proj")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_agreement_is_per_position_for_sequence_outputs():
    reference = np.zeros((2, 3, 4))
    reference[..., 1] = 1.0  # class 1 everywhere
    quantized = reference.copy()
    quantized[0, 2] = [0, 0, 5, 0]  # one of six positions changes its class
    metric = Agreement()
    metric.update(quantized, reference)
    assert metric.result() == pytest.approx(5 / 6)


def test_top1_takes_one_label_per_position():
    scores = np.eye(4)[[[0, 1, 2], [3, 3, 3]]]  # (2, 3, 4)
    metric = TopK(1)
    metric.update(scores, np.array([[0, 1, 0], [3, 3, 3]]))
    assert metric.result() == pytest.approx(5 / 6)


def test_a_shape_mismatch_names_both_shapes():
    with pytest.raises(lpq.DataError, match=r"output has shape \(2, 3, 4\).*labels have shape"):
        TopK(1).update(np.zeros((2, 3, 4)), np.zeros((5,)))


def test_cosine_for_one_value_per_sample_compares_the_batch():
    metric = CosineSimilarity()
    metric.update(np.array([[1.0], [2.0], [3.0]]), np.array([[1.0], [2.0], [3.0]]))
    metric.update(np.array([1.0, -1.0]), np.array([-1.0, 1.0]))  # opposite
    assert metric.result() == pytest.approx((3 * 1.0 + 2 * -1.0) / 5)


@pytest.mark.parametrize(
    ("shape", "name"),
    [((8, 10), "agreement"), ((8, 26, 6625), "agreement"), ((8, 1), "cosine"), ((8,), "cosine")],
)
def test_label_free_metric_is_chosen_from_the_output_shape(shape, name):
    chosen, why = label_free_metric([np.zeros(shape, np.float32)])
    assert chosen == name
    assert str(shape) in why


def test_fit_without_labels_on_a_sequence_model(tmp_path: Path):
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(16, 12)).astype(np.float32)
    model = matmul_model(tmp_path / "seq.onnx", ["N", 7, 12], weight, ["N", 7, 16])
    x = rng.normal(size=(48, 7, 16)).astype(np.float32)
    result = lpq.fit(
        str(model),
        lpq.PostTrainingQuantConfig(
            accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.2),
            # One tiny MatMul is not reliably faster in int8: size, not timing, decides.
            tuning_criterion=lpq.TuningCriterion(max_trials=3, objective="modelsize"),
        ),
        calib_dataloader=lpq.ArrayLoader(x[:16], batch_size=16),
        eval_dataloader=lpq.ArrayLoader(x[16:], batch_size=16),
        workspace=tmp_path / "ws",
    )
    assert result.metric == "agreement"
    assert result.baseline.accuracy == 1.0
    assert "at every position" in result.metric_note
    assert result.best.accuracy > 0.8 and result.best.quantized_ops == 1


def test_cli_states_the_metric_it_chose_for_a_regression_output(tmp_path: Path, capsys):
    rng = np.random.default_rng(1)
    model = matmul_model(
        tmp_path / "reg.onnx", ["N", 1], rng.normal(size=(8, 1)).astype(np.float32), ["N", 8]
    )
    x = rng.normal(size=(64, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x[:32])
    np.savez(tmp_path / "eval.npz", x=x[32:])
    code = main(
        [
            "tune",
            str(model),
            "--calib",
            str(tmp_path / "calib.npz"),
            "--eval",
            str(tmp_path / "eval.npz"),
            "--workspace",
            str(tmp_path / "ws"),
            "--out",
            str(tmp_path / "q.onnx"),
            "--tolerable-loss",
            "0.05",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "cosine: fp32 1.0000" in out
    assert "holds no class scores: accuracy is the cosine similarity" in out


def test_quantize_scores_an_output_named_as_hidden_states_by_cosine(tmp_path: Path, capsys):
    """A (B, T, D) output is ambiguous by shape; named ``last_hidden_state`` (lpq-onnxrt's
    ``lpq_output_names``), the fidelity check scores it by cosine, not per-token top-1."""
    rng = np.random.default_rng(2)
    weight = rng.normal(size=(16, 64)).astype(np.float32)
    x = rng.normal(size=(40, 7, 16)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    for output, metric in (("last_hidden_state", "cosine"), ("scores", "agreement")):
        model = matmul_model(
            tmp_path / f"{output}.onnx", ["N", 7, 64], weight, ["N", 7, 16], output=output
        )
        pm = lpq.get_plugin_manager()
        assert pm.output_names("onnxrt", str(model)) == [output]
        code = main(
            [
                "quantize",
                str(model),
                "--calib",
                str(tmp_path / "calib.npz"),
                "--out",
                str(tmp_path / f"q-{output}.onnx"),
                "--no-latency-aware",
            ]
        )
        out = capsys.readouterr().out
        assert code == 0, out
        assert f"({metric} against fp32" in out, out
        named = "output 'last_hidden_state'" in out and "named as hidden states" in out
        assert named == (metric == "cosine"), out
