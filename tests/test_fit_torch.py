"""The tuner end to end on the PyTorch adaptor: models that are Python objects."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import lpq


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Two intra-op threads spin against each other on a loaded 2-core CI machine (a
    64-wide Linear then takes milliseconds); one thread is what this test needs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def trained_digits_mlp() -> tuple[torch.nn.Module, np.ndarray, np.ndarray]:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    inputs, targets = torch.tensor(x[:1200]), torch.tensor(y[:1200])
    for _ in range(60):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    return model.eval(), x, y


def test_fit_quantizes_a_module_within_tolerance_and_resumes(tmp_path):
    model, x, y = trained_digits_mlp()
    conf = lpq.PostTrainingQuantConfig(
        accuracy_criterion=lpq.AccuracyCriterion(tolerable_loss=0.01),
        # Speed is not the point here, and a 64-unit MLP is not reliably faster in int8:
        # under the performance objective a slower candidate would not meet the goal.
        tuning_criterion=lpq.TuningCriterion(max_trials=5, objective="modelsize"),
    )
    calib = lpq.ArrayLoader(x[1200:1400], batch_size=32)
    evaluation = lpq.ArrayLoader(x[1400:], y[1400:], batch_size=64)  # last batch is partial
    result = lpq.fit(model, conf, calib, eval_dataloader=evaluation, workspace=tmp_path)
    assert result.framework == "torch"
    assert result.goal_met
    assert result.baseline.accuracy > 0.9
    assert result.best.accuracy >= result.baseline.accuracy * 0.99
    assert result.best.quantized_ops >= 2
    saved = result.save(tmp_path / "digits-int8")
    assert saved.exists()
    again = lpq.fit(model, conf, calib, eval_dataloader=evaluation, workspace=tmp_path)
    assert all(trial.resumed for trial in again.trials)
