"""The public API and the plugin contract change only with a CHANGELOG.md entry.

``docs/api-snapshot.txt`` holds lpq's public API (``lpq.__all__`` with signatures, and every
hook spec) as written by ``scripts/api_snapshot.py``, under the CHANGELOG.md heading that
documents it. Changing the API without writing the snapshot again fails here; writing it
again needs a heading that exists in CHANGELOG.md and names the current core version.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path

import lpq

ROOT = Path(__file__).resolve().parents[1]


def _snapshot_tool():
    spec = importlib.util.spec_from_file_location("api_snapshot", ROOT / "scripts/api_snapshot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("api_snapshot", module)
    spec.loader.exec_module(module)
    return module


def test_public_api_matches_the_snapshot():
    tool = _snapshot_tool()
    _, recorded = tool.read_snapshot()
    live = tool.api_lines()
    diff = "\n".join(difflib.unified_diff(recorded, live, "snapshot", "live", lineterm=""))
    assert recorded == live, (
        "lpq's public API changed. Document it in CHANGELOG.md (Breaking / Deprecated / "
        "Added), bump the version if it breaks, then run: python scripts/api_snapshot.py "
        '--write --changelog "<the heading>"\n' + diff
    )


def test_the_snapshot_names_a_changelog_heading_of_this_version():
    tool = _snapshot_tool()
    heading, _ = tool.read_snapshot()
    assert heading in tool.changelog_headings()
    assert lpq.__version__ in heading, (heading, lpq.__version__)


def test_the_check_sees_a_changed_signature(monkeypatch):
    tool = _snapshot_tool()
    before = tool.api_lines()

    def quantize(model, conf, calib, *, brand_new_option=None):  # a changed signature
        return None

    # lpq.quantize is a lazy attribute: set it for this test only (undone afterwards).
    monkeypatch.setattr(lpq, "quantize", quantize, raising=False)
    assert tool.api_lines() != before
    monkeypatch.undo()
    assert tool.api_lines() == before


def test_a_deprecation_warns_with_its_removal_and_replacement():
    import pytest

    from lpq.errors import warn_deprecated

    with pytest.warns(lpq.LpqDeprecationWarning, match="since lpq-core 0.2.*removed in 0.3.*use"):
        warn_deprecated("old_name", since="0.2", removal="0.3", instead="use new_name")
    assert issubclass(lpq.LpqDeprecationWarning, DeprecationWarning)
