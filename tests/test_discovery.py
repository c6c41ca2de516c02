"""Plugin discovery from real (fake-installed) distributions, in this process.

Each test installs distributions into a temporary site directory (see ``conftest.py``),
then asks a fresh plugin manager for its records. Installed plugins of this repo are kept
out with the allow list, so the results do not depend on what else is installed.
"""

from __future__ import annotations

import sys

import pytest
from core_testutil import GOOD_PLUGIN, RAISING_PLUGIN, WRONG_SIGNATURE_PLUGIN, FakeSite

import lpq
from lpq.plugins import discovery
from lpq.plugins.discovery import PluginStatus


def records(monkeypatch: pytest.MonkeyPatch, allow: str) -> dict[str, discovery.PluginRecord]:
    monkeypatch.setenv("LPQ_LOAD_PLUGINS", allow)
    return {r.name: r for r in lpq.get_plugin_manager().records()}


def test_good_plugin_is_loaded_and_its_hooks_are_called(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    record = records(monkeypatch, "toy")["toy"]
    assert record.status is PluginStatus.OK
    assert record.distribution == "lpq-toy" and record.version == "1.0"
    assert record.requires_core == ">=0.1"
    assert record.hooks == ["lpq_detect_framework", "lpq_register_adaptors"]
    assert record.frameworks == [
        {"framework": "toyfw", "distribution": "toyfw-runtime", "installed": None}
    ]
    pm = lpq.get_plugin_manager()
    assert pm.detect_framework("toyfw-model") == "toyfw"
    assert pm.adaptor("toyfw").framework_distribution == "toyfw-runtime"


def test_plugin_raising_on_import_is_isolated(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    fake_site.add("lpq-broken", "broken", RAISING_PLUGIN)
    found = records(monkeypatch, "toy,broken")
    broken = found["broken"]
    assert broken.status is PluginStatus.ERROR
    assert "import failed" in broken.message
    assert "toy plugin exploded while importing" in broken.message
    assert "LPQ_DISABLE_PLUGINS=broken" in broken.hint
    assert found["toy"].status is PluginStatus.OK, "one broken plugin must not break others"
    assert lpq.get_plugin_manager().detect_framework("toyfw-model") == "toyfw"


def test_plugin_raising_on_import_fails_in_strict_mode(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-broken", "broken", RAISING_PLUGIN)
    monkeypatch.setenv("LPQ_PLUGINS_STRICT", "1")
    with pytest.raises(lpq.PluginError, match="toy plugin exploded while importing") as info:
        records(monkeypatch, "broken")
    assert "'broken'" in info.value.message


def test_wrong_hook_signature_is_reported(fake_site: FakeSite, monkeypatch):
    module = fake_site.add("lpq-oddsig", "oddsig", WRONG_SIGNATURE_PLUGIN)
    record = records(monkeypatch, "oddsig")["oddsig"]
    assert record.status is PluginStatus.ERROR
    assert "hook validation failed" in record.message
    assert "lpq_register_adaptors" in record.message and "colour" in record.message
    assert "docs/writing-a-plugin.md" in record.hint
    pm = lpq.get_plugin_manager()
    assert pm._pm.get_plugin("oddsig") is None, "a plugin failing validation is unregistered"
    assert module in sys.modules  # it was imported: validation happens after import


def test_wrong_hook_signature_fails_in_strict_mode(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-oddsig", "oddsig", WRONG_SIGNATURE_PLUGIN)
    monkeypatch.setenv("LPQ_PLUGINS_STRICT", "1")
    with pytest.raises(lpq.PluginError, match="colour"):
        records(monkeypatch, "oddsig")


def test_unknown_hook_name_is_reported(fake_site: FakeSite, monkeypatch):
    source = "import lpq\n\n@lpq.hookimpl\ndef lpq_quantise(framework):\n    return None\n"
    fake_site.add("lpq-typo", "typo", source)
    record = records(monkeypatch, "typo")["typo"]
    assert record.status is PluginStatus.ERROR
    assert "lpq_quantise" in record.message


@pytest.mark.parametrize("requirement", ["<0.1", ">=99", ">=0.1,<0.1.0"])
def test_incompatible_core_range_is_reported_and_not_imported(
    fake_site: FakeSite, monkeypatch, requirement: str
):
    module = fake_site.add("lpq-future", "future", RAISING_PLUGIN, requires_core=requirement)
    record = records(monkeypatch, "future")["future"]
    assert record.status is PluginStatus.INCOMPATIBLE
    assert f"requires lpq-core{record.requires_core}" in record.message
    assert f"lpq-core {lpq.__version__} is installed" in record.message
    assert "lpq-future" in record.hint
    assert module not in sys.modules, "an incompatible plugin must not be imported"


def test_incompatible_plugin_fails_in_strict_mode(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-future", "future", RAISING_PLUGIN, requires_core=">=99")
    monkeypatch.setenv("LPQ_PLUGINS_STRICT", "1")
    with pytest.raises(lpq.PluginError, match=r"requires lpq-core>=99"):
        records(monkeypatch, "future")


@pytest.mark.parametrize("requirement", [None, ">=0.2,<0.3", "~=0.2"])
def test_compatible_or_undeclared_core_range_loads(
    fake_site: FakeSite, monkeypatch, requirement: str | None
):
    fake_site.add(
        "lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"), requires_core=requirement
    )
    record = records(monkeypatch, "toy")["toy"]
    assert record.status is PluginStatus.OK
    if requirement is None:
        assert record.requires_core is None
    else:
        assert discovery.core_satisfies(record.requires_core)
        assert set(record.requires_core.split(",")) == set(requirement.split(","))


def test_two_distributions_claiming_one_name(fake_site: FakeSite, monkeypatch):
    first = fake_site.add("lpq-twin-a", "twin", GOOD_PLUGIN.format(framework="fw_a"))
    second = fake_site.add("lpq-twin-b", "twin", GOOD_PLUGIN.format(framework="fw_b"))
    monkeypatch.setenv("LPQ_LOAD_PLUGINS", "twin")
    found = [r for r in lpq.get_plugin_manager().records() if r.name == "twin"]
    assert len(found) == 1  # one row per plugin name
    record = found[0]
    assert record.status is PluginStatus.ERROR
    assert "lpq-twin-a" in record.message and "lpq-twin-b" in record.message
    assert "LPQ_DISABLE_PLUGINS" in record.hint
    assert first not in sys.modules and second not in sys.modules


def test_two_distributions_claiming_one_name_in_discovery(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-twin-a", "twin", GOOD_PLUGIN.format(framework="fw_a"))
    fake_site.add("lpq-twin-b", "twin", GOOD_PLUGIN.format(framework="fw_b"))
    twins = [d.record for d in discovery.discover() if d.record.name == "twin"]
    assert sorted(r.distribution for r in twins) == ["lpq-twin-a", "lpq-twin-b"]
    for record in twins:
        assert record.status is PluginStatus.ERROR
        assert "claimed by lpq-twin-a and lpq-twin-b" in record.message


def test_two_distributions_claiming_one_name_fail_in_strict_mode(fake_site, monkeypatch):
    fake_site.add("lpq-twin-a", "twin", GOOD_PLUGIN.format(framework="fw_a"))
    fake_site.add("lpq-twin-b", "twin", GOOD_PLUGIN.format(framework="fw_b"))
    monkeypatch.setenv("LPQ_PLUGINS_STRICT", "1")
    with pytest.raises(lpq.PluginError, match="lpq-twin-a and lpq-twin-b"):
        records(monkeypatch, "twin")


def test_deny_list_is_applied_before_import(fake_site: FakeSite, monkeypatch):
    module = fake_site.add("lpq-broken", "broken", RAISING_PLUGIN)
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    monkeypatch.setenv("LPQ_DISABLE_PLUGINS", " broken , other")
    monkeypatch.setenv("LPQ_PLUGINS_STRICT", "1")  # importing it would raise
    found = records(monkeypatch, "toy,broken")
    assert found["broken"].status is PluginStatus.DISABLED
    assert "LPQ_DISABLE_PLUGINS" in found["broken"].message
    assert module not in sys.modules
    assert found["toy"].status is PluginStatus.OK


def test_allow_list_is_applied_before_import(fake_site: FakeSite, monkeypatch):
    module = fake_site.add("lpq-broken", "broken", RAISING_PLUGIN)
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    monkeypatch.setenv("LPQ_PLUGINS_STRICT", "1")
    found = records(monkeypatch, "toy")
    assert found["broken"].status is PluginStatus.DISABLED
    assert "LPQ_LOAD_PLUGINS" in found["broken"].message
    assert module not in sys.modules
    assert found["toy"].status is PluginStatus.OK


def test_deny_list_wins_over_allow_list(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    monkeypatch.setenv("LPQ_DISABLE_PLUGINS", "toy")
    record = records(monkeypatch, "toy")["toy"]
    assert record.status is PluginStatus.DISABLED
    with pytest.raises(lpq.NoAdaptorError, match="toyfw"):
        lpq.get_plugin_manager().adaptor("toyfw")


def test_entry_point_metadata_is_read_once(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    calls = []
    real = discovery.metadata.entry_points

    def counting(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(discovery.metadata, "entry_points", counting)
    discovery.clear_cache()
    for _ in range(3):
        discovery.discover()
    assert calls == [{"group": "lpq"}]


def test_discovery_imports_no_plugin(fake_site: FakeSite):
    module = fake_site.add("lpq-broken", "broken", RAISING_PLUGIN)
    found = {d.record.name: d.record for d in discovery.discover()}
    assert found["broken"].status is PluginStatus.PENDING
    assert module not in sys.modules


def test_strict_mode_values(monkeypatch):
    for value, expected in [("1", True), ("true", True), ("ON", True), ("0", False), ("", False)]:
        monkeypatch.setenv("LPQ_PLUGINS_STRICT", value)
        assert discovery.strict_mode() is expected


REGISTRATION_RAISES = """\
import lpq


@lpq.hookimpl
def lpq_register_adaptors(register):
    raise KeyError("capability_files")
"""


def test_registration_hook_raising_is_listed_as_error(fake_site: FakeSite, monkeypatch):
    fake_site.add("lpq-toy", "toy", GOOD_PLUGIN.format(framework="toyfw"))
    fake_site.add("lpq-halfway", "halfway", REGISTRATION_RAISES)
    found = records(monkeypatch, "toy,halfway")
    record = found["halfway"]
    assert record.status is PluginStatus.ERROR
    assert "registration failed: KeyError" in record.message
    assert "LPQ_DISABLE_PLUGINS=halfway" in record.hint
    assert found["toy"].status is PluginStatus.OK
    assert lpq.get_plugin_manager()._pm.get_plugin("halfway") is None


NO_FRAMEWORK_PARAMETER = """\
import lpq


@lpq.hookimpl
def lpq_quantize(model, tune_cfg):
    return "hijacked every framework"
"""


def test_per_framework_hook_without_framework_parameter_is_rejected(
    fake_site: FakeSite, monkeypatch
):
    fake_site.add("lpq-greedy", "greedy", NO_FRAMEWORK_PARAMETER)
    record = records(monkeypatch, "greedy")["greedy"]
    assert record.status is PluginStatus.ERROR
    assert "lpq_quantize must take the 'framework' parameter" in record.message
    assert lpq.get_plugin_manager()._pm.get_plugin("greedy") is None


def test_hooks_may_take_a_subset_of_parameters(fake_site: FakeSite, monkeypatch):
    source = GOOD_PLUGIN.format(framework="toyfw") + (
        "\n\n@lpq.hookimpl\ndef lpq_load_model(framework):\n"
        "    return 'loaded' if framework == 'toyfw' else None\n"
    )
    fake_site.add("lpq-toy", "toy", source)
    assert records(monkeypatch, "toy")["toy"].status is PluginStatus.OK
    assert lpq.get_plugin_manager().load_model("toyfw", "any/path") == "loaded"
