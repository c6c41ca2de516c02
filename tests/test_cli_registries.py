"""What plugins register is discoverable from the command line: ``lpq plugins list -v``
and ``--json`` name every strategy, metric, executor, backend profile and example, and
``lpq deploy --help`` lists the installed backends."""

from __future__ import annotations

import json

from lpq.plugins.manager import get_plugin_manager


def test_json_names_what_each_plugin_registered(run_lpq):
    result = run_lpq("plugins", "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    pm = get_plugin_manager()
    for name in pm.backend_profiles:
        owner = pm.backend_profiles.owner(name)
        assert name in rows[owner]["registered"]["backend profile"], (name, owner)
    assert rows["onnxrt"]["registered"]["adaptor"] == ["onnxrt"]
    assert "digits" in rows["onnxrt"]["registered"]["example"]


def test_verbose_listing_names_core_and_plugin_registrations(run_lpq):
    result = run_lpq("plugins", "list", "-v")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # rich wraps long lines
    pm = get_plugin_manager()
    for name in [*pm.strategies, *pm.metrics, *pm.executors, *pm.backend_profiles]:
        assert name in text, name
    assert "lpq-core (built in) registers: strategy: auto" in text
    assert "CPU int8 features:" in text


def test_deploy_help_lists_installed_backends(run_lpq):
    result = run_lpq("deploy", "--help")
    assert result.returncode == 0, result.stderr
    assert "Installed backends" in result.stdout
    for name in get_plugin_manager().backend_profiles:
        assert name in result.stdout, name
