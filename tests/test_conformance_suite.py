"""The conformance suite proves what it claims (issue 11, item 16).

It used to miss 4 of 10 planted bugs. Here a small numpy adaptor with real int8 rounding
(``npq_adaptor``) is installed as a distribution and the suite is run against it in a
fresh pytest process: clean, it passes every check; with each planted bug, the check for
that bug fails; and a broken plugin installed beside it fails only its own check.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from core_testutil import RAISING_PLUGIN, FakeSite
from npq_adaptor import CAPABILITY_YAML

HERE = Path(__file__).resolve().parent

CONFTEST = """
import numpy as np
import pytest

import lpq
from npq_adaptor import NpqModel


@pytest.fixture
def lpq_sample_model():
    rng = np.random.default_rng(0)
    return NpqModel({
        "w1": rng.normal(0, 0.5, (8, 16)).astype(np.float32),
        "w2": rng.normal(0, 0.5, (16, 4)).astype(np.float32),
    })


@pytest.fixture
def lpq_sample_data(lpq_sample_model):
    x = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
    labels = lpq_sample_model.run(x).argmax(axis=1)
    return lpq.ArrayLoader(x, labels, batch_size=16)


@pytest.fixture
def lpq_misfit_data():
    return lpq.ArrayLoader(np.zeros((4, 5), np.float32), np.zeros(4, np.int64), batch_size=2)
"""

SUITE = """
from lpq.testing import AdaptorConformance


class TestNpq(AdaptorConformance):
    framework = "npq"
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FakeSite]:
    """The npq adaptor installed (dist-info + module) and a test folder using the suite."""
    root = tmp_path_factory.mktemp("npq")
    site = FakeSite(root / "site")
    site.path.mkdir()
    site.add("lpq-npq", "npq", (HERE / "npq_adaptor.py").read_text(), module="npq_adaptor")
    (site.path / "npq_adaptor.yaml").write_text(CAPABILITY_YAML)
    tests = root / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "test_npq_conformance.py").write_text(SUITE)
    return tests, site


def run_suite(project: tuple[Path, FakeSite], **env: str) -> dict[str, str]:
    """Run the suite in a fresh pytest process; the outcome of each test by name."""
    tests, site = project
    report = tests / f"report-{env.get('NPQ_BUG', 'clean')}.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=tests,
        env=site.env(LPQ_PLUGINS_STRICT="1", LPQ_CONFORMANCE_STRICT="1", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[case.get("name", "")] = "failed" if failed else "passed"
    return outcomes


def failures(outcomes: dict[str, str]) -> set[str]:
    return {name for name, outcome in outcomes.items() if outcome == "failed"}


def test_a_correct_adaptor_passes_every_check(project):
    outcomes = run_suite(project)
    assert len(outcomes) >= 20
    assert failures(outcomes) == set()


@pytest.mark.parametrize(
    ("bug", "caught_by"),
    [
        ("coarse_scales", {"test_each_op_error_is_about_one_quantization_step"}),
        (
            "npz_detection",
            {
                "test_declines_lpq_data_and_other_frameworks_models[lpq-npz-data]",
                "test_declines_lpq_data_and_other_frameworks_models[torch-pt2]",
                "test_declines_lpq_data_and_other_frameworks_models[keras]",
            },
        ),
        ("mutates", {"test_quantize_leaves_the_callers_model_unchanged"}),
        ("ignores_sampling", {"test_calibration_reads_at_most_the_sampling_size"}),
    ],
)
def test_each_planted_bug_fails_its_check(project, bug, caught_by):
    assert failures(run_suite(project, NPQ_BUG=bug)) == caught_by


def test_a_broken_unrelated_plugin_fails_only_its_own_check(tmp_path_factory, project):
    _, site = project
    broken_site = FakeSite(tmp_path_factory.mktemp("broken"))
    broken_site.add("lpq-broken", "broken", textwrap.dedent(RAISING_PLUGIN))
    site.extra_paths.append(str(broken_site.path))
    try:
        outcomes = run_suite(project)
    finally:
        site.extra_paths.remove(str(broken_site.path))
    assert failures(outcomes) == {"test_other_installed_plugins_load"}
