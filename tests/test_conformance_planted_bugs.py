"""The conformance suite proves that work was done (issue 28, build item 4).

Three bugs it used to miss are planted in a small numpy adaptor (``npq_planted``: an
identity quantizer that claims int8, an evaluate that ignores the labels, a capability YAML
naming an op type npq does not have). Each fails its check, run programmatically in strict
mode and as the whole suite in a fresh pytest process, while the clean adaptor passes all.
The warn-first mechanism is tested on both sides of the introducing version.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import npq_adaptor
import npq_planted
import numpy as np
import pytest
from core_testutil import FakeSite
from test_conformance_suite import CONFTEST, failures, run_suite

import lpq
from lpq import _version
from lpq.testing import AdaptorConformance, ConformanceFailure, ConformanceWarning
from lpq.testing.grid import on_grid
from lpq.testing.introduced import STRICT_ENV, core_minor, enforced, introduced
from lpq.testing.labels import check_evaluate_uses_labels, deranged
from lpq.testing.op_types import capability_op_types, check_op_types_known
from lpq.testing.proof import (
    check_outputs_differ_from_fp32,
    check_reports_integer_ops,
    check_weights_are_quantized,
)
from lpq.testing.subject import Subject

HERE = Path(__file__).resolve().parent
NEW_CHECKS = (
    "test_quantized_ops_report_an_integer_precision",
    "test_int8_weights_lie_on_a_grid_and_differ_from_fp32",
    "test_quantized_outputs_differ_from_fp32",
    "test_evaluate_scores_against_the_labels",
    "test_capability_op_types_exist_in_the_framework",
)


@pytest.fixture
def plant() -> str | None:
    """The bug planted in the adaptor (``NPQ_PLANT``); tests parametrize it."""
    return None


@pytest.fixture
def subject(
    lpq_plugin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plant: str | None
) -> Subject:
    """npq_planted registered alone (strict mode), with npq's sample model and data (its
    labels are the model's argmax, so it is accurate on them)."""
    (tmp_path / "npq.yaml").write_text(npq_adaptor.CAPABILITY_YAML)
    (tmp_path / "unknown.yaml").write_text(npq_planted.UNKNOWN_OP_YAML)
    monkeypatch.setattr(npq_adaptor, "CAPABILITY", tmp_path / "npq.yaml")
    monkeypatch.setattr(npq_planted, "UNKNOWN_OP_CAPABILITY", tmp_path / "unknown.yaml")
    monkeypatch.delenv("NPQ_BUG", raising=False)
    if plant is None:
        monkeypatch.delenv("NPQ_PLANT", raising=False)
    else:
        monkeypatch.setenv("NPQ_PLANT", plant)
    monkeypatch.setenv(STRICT_ENV, "1")
    pm = lpq_plugin(npq_planted, name="npq")
    rng = np.random.default_rng(0)
    model = npq_adaptor.NpqModel(
        {
            "w1": rng.normal(0, 0.5, (8, 16)).astype(np.float32),
            "w2": rng.normal(0, 0.5, (16, 4)).astype(np.float32),
        }
    )
    x = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
    data = lpq.ArrayLoader(x, model.run(x).argmax(axis=1), batch_size=16)
    return Subject(pm, "npq", pm.query_capability("npq", model, data, {}), model, data)


def run_new_checks(subject: Subject) -> dict[str, str]:
    """Each new check's outcome: ``passed``, or the start of its failure message."""
    files = subject.pm.adaptor("npq").capability_files
    checks = {
        "reports_integer_ops": lambda: check_reports_integer_ops(subject, subject.quantize()),
        "weights_are_quantized": lambda: check_weights_are_quantized(subject),
        "outputs_differ": lambda: check_outputs_differ_from_fp32(subject),
        "uses_labels": lambda: check_evaluate_uses_labels(subject),
        "op_types_known": lambda: check_op_types_known(files, npq_planted.KNOWN_OP_TYPES, "npq"),
    }
    outcomes = {}
    for name, check in checks.items():
        try:
            check()
            outcomes[name] = "passed"
        except ConformanceFailure as exc:
            outcomes[name] = str(exc)[:60]
    return outcomes


def test_the_honest_adaptor_passes_every_new_check_without_a_warning(subject):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConformanceWarning)
        outcomes = run_new_checks(subject)
    assert set(outcomes.values()) == {"passed"}


@pytest.mark.parametrize(
    ("plant", "caught_by"),
    [
        ("identity", {"weights_are_quantized", "outputs_differ"}),
        ("ignores_labels", {"uses_labels"}),
        ("unknown_op", {"op_types_known"}),
    ],
)
def test_each_planted_bug_fails_its_check(subject, plant, caught_by):
    outcomes = run_new_checks(subject)
    assert {name for name, outcome in outcomes.items() if outcome != "passed"} == caught_by


# --------------------------------------------------------------------------- warn first


@pytest.mark.parametrize("plant", ["identity"])
@pytest.mark.parametrize(
    ("version", "strict", "fails"),
    [("0.1.0", "", False), ("0.2.0", "", False), ("0.2.7", "0", False),
     ("0.2.0", "1", True), ("0.3.0", "", True), ("1.0.0", "", True)],
)  # fmt: skip
def test_a_new_check_warns_in_its_minor_version_and_fails_after(
    subject, monkeypatch, plant, version, strict, fails
):
    monkeypatch.setattr(_version, "__version__", version)
    monkeypatch.setenv(STRICT_ENV, strict)
    suite = AdaptorConformance()
    if fails:
        with pytest.raises(ConformanceFailure, match="bit-identical"):
            suite.test_quantized_outputs_differ_from_fp32(subject)
    else:
        with pytest.warns(ConformanceWarning, match=r"new in lpq-core 0\.2; it fails from 0\.3"):
            suite.test_quantized_outputs_differ_from_fp32(subject)


def test_a_passing_new_check_says_nothing(subject, monkeypatch):
    monkeypatch.setattr(_version, "__version__", "0.2.0")
    monkeypatch.delenv(STRICT_ENV)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AdaptorConformance().test_quantized_outputs_differ_from_fp32(subject)


def test_the_warning_period_follows_the_real_core_version(monkeypatch):
    monkeypatch.delenv(STRICT_ENV, raising=False)
    assert core_minor() == tuple(int(p) for p in lpq.__version__.split(".")[:2])
    assert enforced("0.2") == (core_minor() > (0, 2))
    assert not enforced(".".join(map(str, core_minor())))
    monkeypatch.setenv(STRICT_ENV, "1")
    assert enforced("9.9")


def test_every_new_check_is_marked_with_its_version():
    for name in NEW_CHECKS:
        assert getattr(AdaptorConformance, name).introduced == "0.2"
    with pytest.raises(ValueError):
        introduced("soon")


def test_without_known_op_types_the_check_warns_that_it_did_not_run(subject):
    files = subject.pm.adaptor("npq").capability_files
    with pytest.warns(ConformanceWarning, match="does not implement known_op_types"):
        check_op_types_known(files, None, "npq")


# --------------------------------------------------------------------------- helpers


def test_capability_op_types_are_read_from_ops_capabilities_and_patterns(tmp_path):
    yaml_file = tmp_path / "cap.yaml"
    yaml_file.write_text(npq_planted.UNKNOWN_OP_YAML + "  patterns: [MatMul + Relu]\n")
    assert set(capability_op_types([yaml_file])) == {"MatMul", "FancyMatMul", "Relu"}


def test_int8_weights_are_on_a_grid_and_fp32_weights_are_not():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 8)).astype(np.float32)
    scale = np.abs(w).max(axis=0) / 127
    per_channel = (np.round(w / scale) * scale).astype(np.float32)
    assert on_grid(per_channel) and on_grid(per_channel.T)
    low, high = float(w.min()), float(w.max())
    step, zero = (high - low) / 255, round(-low / ((high - low) / 255))
    asymmetric = ((np.clip(np.round(w / step) + zero, 0, 255) - zero) * step).astype(np.float32)
    assert on_grid(asymmetric)
    assert not on_grid(w)
    assert not on_grid(per_channel + rng.normal(0, 1e-3, w.shape).astype(np.float32))


def test_deranged_labels_move_every_sample_and_keep_few_classes():
    labels = np.array([0, 0, 0, 1, 1, 2, 3, 3, 2, 1])
    shuffled = deranged(labels)
    assert sorted(shuffled) == sorted(labels)
    assert not np.any(shuffled == labels)
    grid = np.arange(12).reshape(6, 2)
    assert not np.any(np.all(deranged(grid) == grid, axis=1))


# --------------------------------------------------------------------------- whole suite

SUITE = """
from lpq.testing import AdaptorConformance


class TestNpqPlanted(AdaptorConformance):
    framework = "npq"

    def known_op_types(self):
        return {"MatMul"}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FakeSite]:
    """npq_planted installed (npq_adaptor beside it as a plain module) and the suite."""
    root = tmp_path_factory.mktemp("npq-planted")
    site = FakeSite(root / "site")
    site.path.mkdir()
    (site.path / "npq_adaptor.py").write_text((HERE / "npq_adaptor.py").read_text())
    (site.path / "npq_adaptor.yaml").write_text(npq_adaptor.CAPABILITY_YAML)
    (site.path / "npq_unknown_op.yaml").write_text(npq_planted.UNKNOWN_OP_YAML)
    site.add("lpq-npq", "npq", (HERE / "npq_planted.py").read_text(), module="npq_planted")
    tests = root / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "test_npq_conformance.py").write_text(SUITE)
    return tests, site


def test_the_honest_adaptor_passes_the_whole_suite_in_strict_mode(project):
    outcomes = run_suite(project)
    assert set(NEW_CHECKS) <= set(outcomes)
    assert failures(outcomes) == set()


@pytest.mark.parametrize(
    ("plant", "caught_by"),
    [
        (
            "identity",
            {
                "test_int8_weights_lie_on_a_grid_and_differ_from_fp32",
                "test_quantized_outputs_differ_from_fp32",
            },
        ),
        ("ignores_labels", {"test_evaluate_scores_against_the_labels"}),
        ("unknown_op", {"test_capability_op_types_exist_in_the_framework"}),
    ],
)
def test_each_planted_bug_fails_the_whole_suite(project, plant, caught_by):
    assert failures(run_suite(project, NPQ_PLANT=plant)) == caught_by
