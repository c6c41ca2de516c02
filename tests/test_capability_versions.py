"""Version-block matching: the highest block not above the installed version, else default."""

from __future__ import annotations

from pathlib import Path

import pytest

import lpq


def block(name: str, marker: str) -> str:
    """A version block whose only int8 op type is ``marker``, to tell blocks apart."""
    return f"""\
- version:
    name: {name}
  precisions: [int8, fp32]
  ops:
    int8: [{marker}]
    fp32: ['*']
"""


@pytest.fixture
def versions_file(tmp_path: Path) -> Path:
    file = tmp_path / "versions.yaml"
    file.write_text(
        block("'2.13'", "Op213")
        + block("default", "OpDefault")
        + block("'2.1'", "Op21")
        + block("['1.9', '1.10']", "Op19and110")
    )
    return file


@pytest.mark.parametrize(
    ("installed", "picked", "marker"),
    [
        ("2.13", "2.13", "Op213"),  # exact match
        ("2.13.0", "2.13", "Op213"),  # trailing zero
        ("2.13.0+cpu", "2.13", "Op213"),  # local version label (torch CPU wheels)
        ("2.14.1", "2.13", "Op213"),  # newer than every block: the highest
        ("2.5", "2.1", "Op21"),  # between blocks: the one below
        ("2.1.2", "2.1", "Op21"),
        ("2.0.1", "1.10", "Op19and110"),  # 1.10 > 1.9: versions, not strings, are compared
        ("1.10", "1.10", "Op19and110"),  # a list of names in one block
        ("1.9.3", "1.9", "Op19and110"),
        ("1.8", "default", "OpDefault"),  # below every block
        (None, "default", "OpDefault"),  # framework not installed
    ],
)
def test_picks_the_right_block(versions_file: Path, installed, picked: str, marker: str):
    spec = lpq.load_capability(versions_file, "toyfw", installed)
    assert spec.version_block == picked
    assert spec.ops["int8"] == (marker,)
    assert spec.quantizable_op_types() == [marker]


def test_below_every_block_without_default_is_an_error(tmp_path: Path):
    file = tmp_path / "nodefault.yaml"
    file.write_text(block("'2.13'", "A") + block("'2.1'", "B"))
    assert lpq.load_capability(file, "toyfw", "2.2").version_block == "2.1"
    with pytest.raises(lpq.CapabilityError, match=r"framework version 1\.5 .*2\.1, 2\.13"):
        lpq.load_capability(file, "toyfw", "1.5")
    with pytest.raises(lpq.CapabilityError, match="no default block") as info:
        lpq.load_capability(file, "toyfw", None)
    assert "add a 'default' block" in (info.value.hint or "")


def test_unparsable_installed_version_is_an_error(versions_file: Path):
    with pytest.raises(lpq.CapabilityError, match="cannot parse framework version 'banana'"):
        lpq.load_capability(versions_file, "toyfw", "banana")


def test_default_only_file_serves_every_version(tmp_path: Path):
    file = tmp_path / "default.yaml"
    file.write_text(block("default", "Any"))
    for version in ("0.1", "99.0", None):
        assert lpq.load_capability(file, "toyfw", version).version_block == "default"
