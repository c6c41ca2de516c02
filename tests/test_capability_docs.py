"""docs/capability-yaml.md stays true: its examples validate and every schema field and
allowed value is documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from core_testutil import REPO

import lpq

DOC = REPO / "docs" / "capability-yaml.md"
SCHEMA = json.loads((REPO / "schemas" / "capability.schema.json").read_text())


def yaml_blocks(path: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", path.read_text(encoding="utf-8"), re.DOTALL)


def complete_files() -> list[tuple[str, str]]:
    """``yaml`` code blocks of the docs that are whole capability files."""
    found = []
    for doc in (DOC, REPO / "docs" / "writing-a-plugin.md"):
        for index, block in enumerate(yaml_blocks(doc)):
            body = "\n".join(line for line in block.splitlines() if not line.startswith("#"))
            if body.lstrip().startswith("- version:"):
                found.append((f"{doc.name}#{index}", block))
    return found


@pytest.mark.parametrize(("where", "text"), complete_files(), ids=lambda v: str(v)[:30])
def test_documented_examples_validate(tmp_path: Path, where: str, text: str):
    file = tmp_path / "example.yaml"
    file.write_text(text)
    assert lpq.validate_capability_file(file) >= 1, where


def test_there_are_examples():
    assert len(complete_files()) >= 3


def schema_words(node: object) -> set[str]:
    """Every property name and enum value of the schema."""
    words: set[str] = set()
    if isinstance(node, dict):
        words |= {k for k in node.get("properties", {}) if isinstance(k, str)}
        words |= {v for v in node.get("enum", []) if isinstance(v, str)}
        for value in node.values():
            words |= schema_words(value)
    elif isinstance(node, list):
        for value in node:
            words |= schema_words(value)
    return words


def test_every_schema_field_and_value_is_documented():
    text = DOC.read_text(encoding="utf-8")
    words = schema_words(SCHEMA)
    assert {
        "version",
        "precisions",
        "ops",
        "capabilities",
        "patterns",
        "weight",
        "dtype",
        "block_size",
        "per_block",
        "weight_only",
        "algorithms",
    } <= words
    missing = sorted(word for word in words if f"`{word}`" not in text)
    assert not missing, f"docs/capability-yaml.md does not document: {missing}"


def test_documented_default_entry_semantics_hold(tmp_path: Path):
    """The walk-through of the complete example in the doc matches what lpq does."""
    file = tmp_path / "complete.yaml"
    file.write_text(yaml_blocks(DOC)[0])
    spec = lpq.load_capability(file, "acme", "3.2.1")
    assert spec.version_block == "3.2"
    add = spec.for_op_type("Add")
    assert [(c.precision, c.mode) for c in add] == [("int8", "static")]
    assert add[0].weight is None
    matmul = {(c.precision, c.mode) for c in spec.for_op_type("MatMul")}
    assert matmul == {("int8", "static"), ("int8", "dynamic"), ("int4", "weight_only")}
    assert spec.for_op_type("MatMul")[0].activation.algorithm == ("minmax", "kl", "percentile")
    assert spec.float_fallbacks("Conv") == ("fp32", "fp16")
    assert lpq.load_capability(file, "acme", "3.1").version_block == "default"
    assert lpq.load_capability(file, "acme", "2.13.0rc1").version_block == "default"
