"""Invalid capability YAML: every kind of mistake gets a precise error.

Each case edits one line of a valid file and checks the error names the file, the line
of the mistake, the JSON path and what was expected.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from core_testutil import VALID

import lpq

INT4_BLOCK = """\
    int4:
      weight_only:
        MatMul:
          weight: {dtype: [int4]}
"""


def edit(old: str, new: str) -> str:
    assert old in VALID
    return VALID.replace(old, new, 1)


# (case id, file text, line, JSON path or None, expected text in the message)
CASES = [
    (
        "yaml-syntax",
        edit("dtype: [int8]", "dtype: [int8"),
        13,
        None,
        "invalid YAML: expected ',' or ']'",
    ),
    (
        "yaml-tab",
        edit("            dtype: [int8]", "\t    dtype: [int8]"),
        12,
        None,
        "invalid YAML: found character '\\t'",
    ),
    (
        "wrong-type",
        edit("dtype: [int8]", "dtype: int8"),
        12,
        "$[0].capabilities.int8.static.Conv.weight.dtype",
        "expected array, got str 'int8'",
    ),
    (
        "unknown-dtype",
        edit("dtype: [uint8]", "dtype: [uint9]"),
        16,
        "$[0].capabilities.int8.static.Conv.activation.dtype[0]",
        "'uint9' is not allowed; expected one of: int2, ",
    ),
    (
        "unknown-scheme",
        edit("scheme: [sym]", "scheme: [symmetric]"),
        13,
        "$[0].capabilities.int8.static.Conv.weight.scheme[0]",
        "'symmetric' is not allowed; expected one of: sym, asym",
    ),
    (
        "unknown-granularity",
        edit("[per_channel,", "[per_row,"),
        14,
        "$[0].capabilities.int8.static.Conv.weight.granularity[0]",
        "'per_row' is not allowed; expected one of: per_tensor, per_channel, per_block",
    ),
    (
        "unknown-algorithm",
        edit("minmax, kl", "minmax, magic"),
        18,
        "$[0].capabilities.int8.static.Conv.activation.algorithm[1]",
        "algorithm 'magic' is not declared in this block's 'algorithms' (minmax, kl, percentile)",
    ),
    (
        "malformed-algorithm-name",
        edit("minmax, kl", "minmax, Magic-1"),
        18,
        "$[0].capabilities.int8.static.Conv.activation.algorithm[1]",
        "does not match",
    ),
    (
        "unknown-mode",
        edit("static:", "staticc:"),
        9,
        "$[0].capabilities.int8.staticc",
        "'staticc' is not allowed; expected one of: static, dynamic, weight_only, qat",
    ),
    (
        "unknown-precision-key",
        edit("    fp32: ['*']", "    fp33: ['*']"),
        6,
        "$[0].ops.fp33",
        "'fp33' is not allowed",
    ),
    (
        "missing-version",
        edit("- version:\n    name: '1.30'\n  precisions", "- precisions"),
        1,
        "$[0]",
        "'version' is a required property",
    ),
    (
        "version-as-number",
        edit("'1.30'", "1.30"),
        2,
        "$[0].version.name",
        "1.3 is not a framework version",
    ),
    (
        "two-default-blocks",
        edit("'1.30'", "default") + edit("'1.30'", "default"),
        21,
        "$[1].version.name",
        "a second 'default' block (the first is block 0)",
    ),
    (
        "same-version-twice",
        VALID + VALID,
        21,
        "$[1].version.name",
        "version 1.30 already has block 0",
    ),
    (
        "duplicate-key",
        edit("    fp32: ['*']", "    fp32: ['*']\n    int8: [Gemm]"),
        7,
        "$[0].ops.int8",
        "duplicate key 'int8' (first defined on line 5)",
    ),
    ("empty-file", "", None, None, "the file is empty"),
    ("only-comments", "# nothing here yet\n", None, None, "the file is empty"),
    ("scalar-document", "onnxrt\n", 1, "$", "expected a list of version blocks, got a str"),
    (
        "mapping-document",
        "version: {name: default}\n",
        1,
        "$",
        "expected a list of version blocks, got a dict",
    ),
    (
        "undeclared-precision",
        edit("  capabilities:\n", "  capabilities:\n" + INT4_BLOCK),
        8,
        "$[0].capabilities.int4",
        "precision 'int4' is not listed in 'precisions'",
    ),
    (
        "ops-undeclared-precision",
        edit("    fp32: ['*']", "    fp32: ['*']\n    bf16: [Conv]"),
        7,
        "$[0].ops.bf16",
        "precision 'bf16' is not listed in 'precisions'",
    ),
    (
        "capability-for-unlisted-op",
        edit("        Conv:", "        Gemm:"),
        10,
        "$[0].capabilities.int8.static.Gemm",
        "op type 'Gemm' has int8 static capability but is not listed under ops.int8",
    ),
    (
        "float-capability",
        edit("    int8:\n      static", "    fp32:\n      static"),
        8,
        "$[0].capabilities.fp32",
        "float precisions take no quantization capabilities",
    ),
    (
        "unknown-field",
        edit(
            "          activation:",
            "          bias:\n            dtype: [int8]\n          activation:",
        ),
        15,
        "$[0].capabilities.int8.static.Conv.bias",
        "unknown field 'bias'; expected one of: weight, activation",
    ),
    (
        "unknown-block-field",
        VALID + "  precision: [int8]\n",
        20,
        "$[0].precision",
        "unknown field 'precision'",
    ),
    (
        "empty-option-list",
        edit("dtype: [int8]", "dtype: []"),
        12,
        "$[0].capabilities.int8.static.Conv.weight.dtype",
        "[] should be non-empty",
    ),
    (
        "bad-pattern",
        VALID + "  patterns: ['Conv+Relu']\n",
        20,
        "$[0].patterns[0]",
        "'Conv+Relu' is not a fusion pattern",
    ),
    ("no-blocks", "[]\n", 1, "$", "should be non-empty"),
]


@pytest.mark.parametrize(
    ("text", "line", "json_path", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_invalid_file_gives_a_precise_error(
    tmp_path: Path, text: str, line: int | None, json_path: str | None, expected: str
):
    file = tmp_path / "broken-capability.yaml"
    file.write_text(text)
    with pytest.raises(lpq.CapabilityError) as info:
        lpq.validate_capability_file(file)
    message = info.value.message
    where = f"{file}:{line}: " if line is not None else f"{file}: "
    assert message.startswith(where), message
    if json_path is not None:
        assert f"at {json_path}: " in message, message
    assert expected in message, message
    assert info.value.hint, "every capability error says what to do"


def test_the_cases_cover_at_least_ten_kinds():
    assert len({case[0] for case in CASES}) >= 10


def test_valid_base_file_is_valid(tmp_path: Path):
    file = tmp_path / "ok.yaml"
    file.write_text(VALID)
    assert lpq.validate_capability_file(file) == 1


def test_missing_file(tmp_path: Path):
    with pytest.raises(lpq.CapabilityError, match="file not found"):
        lpq.validate_capability_file(tmp_path / "nope.yaml")


def test_undecodable_file(tmp_path: Path):
    file = tmp_path / "binary.yaml"
    file.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(lpq.CapabilityError, match="cannot read the file"):
        lpq.validate_capability_file(file)


def test_unsafe_yaml_tags_are_refused(tmp_path: Path):
    file = tmp_path / "evil.yaml"
    file.write_text("- !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(lpq.CapabilityError, match="invalid YAML"):
        lpq.validate_capability_file(file)


def test_load_capability_reports_the_same_errors(tmp_path: Path):
    file = tmp_path / "broken.yaml"
    file.write_text(edit("dtype: [uint8]", "dtype: [uint9]"))
    with pytest.raises(lpq.CapabilityError, match=r"broken\.yaml:16: .*'uint9'"):
        lpq.load_capability(file, "toyfw", "1.30")
