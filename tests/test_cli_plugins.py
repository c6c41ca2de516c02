"""``lpq plugins list`` and ``lpq --version`` in a subprocess, as a user runs them.

The fake distributions reach the subprocess through ``PYTHONPATH``; the plugins of this
repo installed in the environment are listed beside them.
"""

from __future__ import annotations

import json

import pytest
from core_testutil import GOOD_PLUGIN, RAISING_PLUGIN, WRONG_SIGNATURE_PLUGIN, FakeSite

import lpq


@pytest.fixture
def troubled_site(fake_site: FakeSite) -> FakeSite:
    """One plugin of every status."""
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    fake_site.add("lpq-broken", "broken", RAISING_PLUGIN)
    fake_site.add("lpq-oddsig", "oddsig", WRONG_SIGNATURE_PLUGIN)
    fake_site.add("lpq-future", "future", RAISING_PLUGIN, requires_core="<0.1")
    fake_site.add("lpq-muted", "muted", RAISING_PLUGIN)
    return fake_site


def test_json_listing_reports_every_status_and_exits_0(troubled_site: FakeSite, run_lpq):
    result = run_lpq(
        "plugins", "list", "--json", env=troubled_site.env(LPQ_DISABLE_PLUGINS="muted")
    )
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["toy"]["status"] == "ok"
    assert rows["toy"]["distribution"] == "lpq-toy"
    assert rows["toy"]["frameworks"] == [
        {"framework": "toyfw", "distribution": "toyfw-runtime", "installed": None}
    ]
    assert rows["toy"]["hooks"] == ["lpq_detect_framework", "lpq_register_adaptors"]
    assert rows["broken"]["status"] == "error"
    assert "toy plugin exploded while importing" in rows["broken"]["message"]
    assert rows["broken"]["hint"]
    assert rows["oddsig"]["status"] == "error"
    assert "colour" in rows["oddsig"]["message"]
    assert rows["future"]["status"] == "incompatible"
    assert "requires lpq-core<0.1" in rows["future"]["message"]
    assert rows["muted"]["status"] == "disabled"
    assert "Traceback" not in result.stderr


def test_table_listing_shows_messages_and_hints(troubled_site: FakeSite, run_lpq):
    result = run_lpq("plugins", "list", env=troubled_site.env(COLUMNS="200"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for text in (
        "toy",
        "lpq-toy",
        "toyfw (toyfw-runtime not installed)",
        "error",
        "incompatible",
        "register_adaptors",
    ):
        assert text in out
    assert "broken: import failed: RuntimeError: toy plugin exploded while importing" in out
    assert "hint: reinstall lpq-broken or disable it with LPQ_DISABLE_PLUGINS=broken" in out


@pytest.mark.parametrize(
    ("plugin", "expected"),
    [
        ("broken", "toy plugin exploded while importing"),
        ("oddsig", "colour"),
        ("future", "requires lpq-core<0.1"),
    ],
)
def test_strict_mode_fails_without_traceback(
    troubled_site: FakeSite, run_lpq, plugin: str, expected: str
):
    env = troubled_site.env(LPQ_PLUGINS_STRICT="1", LPQ_LOAD_PLUGINS=f"toy,{plugin}")
    result = run_lpq("plugins", "list", "--json", env=env)
    assert result.returncode != 0
    assert result.stderr.startswith(f"error: plugin {plugin!r}")
    assert expected in result.stderr
    assert "hint:" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_strict_mode_passes_when_the_broken_plugin_is_denied(troubled_site, run_lpq):
    env = troubled_site.env(
        LPQ_PLUGINS_STRICT="1", LPQ_DISABLE_PLUGINS="broken,oddsig,future,muted"
    )
    result = run_lpq("plugins", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr
    statuses = {row["name"]: row["status"] for row in json.loads(result.stdout)}
    assert statuses["toy"] == "ok"
    assert {statuses[n] for n in ("broken", "oddsig", "future", "muted")} == {"disabled"}


def test_version_lists_core_and_plugins(fake_site: FakeSite, run_lpq):
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"), version="2.5")
    result = run_lpq("--version", env=fake_site.env(LPQ_LOAD_PLUGINS="toy"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"lpq-core {lpq.__version__}"
    assert "lpq-toy 2.5 (plugin 'toy', ok)" in lines


def test_no_enabled_plugins_still_lists(fake_site: FakeSite, run_lpq):
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    result = run_lpq("plugins", "list", env=fake_site.env(LPQ_LOAD_PLUGINS="nothing-at-all"))
    assert result.returncode == 0, result.stderr
    assert "disabled" in result.stdout
