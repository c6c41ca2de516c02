"""Every hook of ``core/hookspecs.py`` and each of its parameters is documented.

The plugin author's guide, ``docs/writing-a-plugin.md``, has one section per hook whose
heading names the hook in backticks (``#### `lpq_quantize` ``); inside it every parameter
appears in backticks, and the return value and when the hook is called are stated. The
test reads the hooks with :mod:`inspect`, so a new hook or parameter fails here, by name,
until the guide describes it.
"""

from __future__ import annotations

import inspect
import re

import pytest
from core_testutil import REPO

from lpq import hookspecs

GUIDE = REPO / "docs" / "writing-a-plugin.md"
HEADING = re.compile(r"^(#{2,6})\s+`(lpq_\w+)`\s*$", re.MULTILINE)


def hook_specs() -> dict[str, list[str]]:
    """Hook name -> parameter names, straight from the hook specification module."""
    specs = {}
    for name, function in inspect.getmembers(hookspecs, inspect.isfunction):
        if name.startswith("lpq_") and hasattr(function, f"{hookspecs.PROJECT_NAME}_spec"):
            specs[name] = list(inspect.signature(function).parameters)
    return specs


def hook_sections(text: str) -> dict[str, str]:
    """Hook name -> the text of its section (up to the next heading of any level)."""
    sections = {}
    matches = list(HEADING.finditer(text))
    for match in matches:
        rest = text[match.end() :]
        following = re.search(r"^#{1,6}\s", rest, re.MULTILINE)
        sections[match.group(2)] = rest[: following.start()] if following else rest
    return sections


def missing_documentation(text: str) -> list[str]:
    """What the guide lacks, one readable line per problem (empty: complete)."""
    problems = []
    sections = hook_sections(text)
    specs = hook_specs()
    for hook, params in specs.items():
        section = sections.get(hook)
        if section is None:
            problems.append(f"hook {hook} has no section (a heading `{hook}`)")
            continue
        for param in params:
            if f"`{param}`" not in section:
                problems.append(f"hook {hook}: parameter `{param}` is not documented")
        if "**Returns:**" not in section:
            problems.append(f"hook {hook}: the return value is not documented (**Returns:**)")
        if "**Called:**" not in section:
            problems.append(f"hook {hook}: when it is called is not documented (**Called:**)")
    for hook in sections:
        if hook not in specs:
            problems.append(f"section {hook} documents a hook that does not exist")
    return problems


def test_there_are_hooks_to_document():
    specs = hook_specs()
    assert len(specs) >= 14
    assert specs["lpq_quantize"] == [
        "framework",
        "model",
        "tune_cfg",
        "calib_dataloader",
        "train_func",
    ]
    assert "lpq_register_examples" in specs


def test_every_hook_and_parameter_is_documented():
    problems = missing_documentation(GUIDE.read_text(encoding="utf-8"))
    assert not problems, "docs/writing-a-plugin.md is incomplete:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (("#### `lpq_evaluate`", "#### evaluating"), "hook lpq_evaluate has no section"),
        (
            ("- `train_func` —", "- the training function —"),
            "hook lpq_quantize: parameter `train_func` is not documented",
        ),
        (
            ("#### `lpq_load_model`", "#### `lpq_load_model`\n\n#### `lpq_unload_model`"),
            "section lpq_unload_model documents a hook that does not exist",
        ),
    ],
    ids=["missing-hook", "missing-parameter", "stale-hook"],
)
def test_the_check_names_what_is_missing(mutation: tuple[str, str], expected: str):
    text = GUIDE.read_text(encoding="utf-8")
    old, new = mutation
    assert old in text
    problems = missing_documentation(text.replace(old, new, 1))
    assert any(expected in problem for problem in problems), problems


def test_guide_documents_discovery_controls_and_statuses():
    text = GUIDE.read_text(encoding="utf-8")
    for word in (
        "LPQ_LOAD_PLUGINS",
        "LPQ_DISABLE_PLUGINS",
        "LPQ_PLUGINS_STRICT",
        "`ok`",
        "`disabled`",
        "`incompatible`",
        "`error`",
        "[project.entry-points.lpq]",
        "lpq-core>=",
        "lpq_plugin",
        "AdaptorConformance",
        "lpq_sample_model",
        "lpq_sample_data",
        "lpq_misfit_data",
    ):
        assert word in text, f"docs/writing-a-plugin.md does not mention {word}"
