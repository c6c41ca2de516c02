"""Write or print lpq's public API as text: every name in ``lpq.__all__`` with its signature
(public methods and fields of classes too) and every hook specification.

``tests/test_public_api.py`` compares the live API with ``docs/api-snapshot.txt``: a change
to the public API or the plugin contract fails the suite until the snapshot is written
again, which needs the CHANGELOG.md heading that documents the change::

    .venv/bin/python scripts/api_snapshot.py --write --changelog "Unreleased (lpq-core 0.2.0)"
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "docs" / "api-snapshot.txt"
CHANGELOG = ROOT / "CHANGELOG.md"
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _signature(obj: object) -> str:
    try:
        text = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"
    return _ADDRESS.sub("", text)


def _class_lines(name: str, cls: type) -> list[str]:
    lines = [f"class {name}{_signature(cls)}"]
    if dataclasses.is_dataclass(cls):
        lines += [f"  field {f.name}: {f.type}" for f in dataclasses.fields(cls)]
    for member, value in sorted(vars(cls).items()):
        if member.startswith("_"):
            continue
        if isinstance(value, property):
            lines.append(f"  property {member}")
        elif inspect.isfunction(value) or isinstance(value, classmethod | staticmethod):
            func = value.__func__ if isinstance(value, classmethod | staticmethod) else value
            lines.append(f"  def {member}{_signature(func)}")
    return lines


def api_lines() -> list[str]:
    """The public API, one line per name, method, field and hook, sorted."""
    import lpq
    from lpq import hookspecs

    lines = ["lpq public API"]
    for name in sorted(lpq.__all__):
        if name == "__version__":
            continue
        value = getattr(lpq, name)
        if inspect.isclass(value):
            lines += _class_lines(name, value)
        elif callable(value):
            lines.append(f"def {name}{_signature(value)}")
        else:
            lines.append(f"{name} = {type(value).__name__}")
    for name, func in sorted(vars(hookspecs).items()):
        if name.startswith("lpq_") and inspect.isfunction(func):
            opts = getattr(func, "lpq_spec", {}) or {}
            first = " firstresult" if opts.get("firstresult") else ""
            lines.append(f"hook {name}{_signature(func)}{first}")
    return lines


def read_snapshot() -> tuple[str, list[str]]:
    """The changelog heading the snapshot was written under, and its API lines."""
    text = SNAPSHOT.read_text(encoding="utf-8").splitlines()
    heading = text[0].removeprefix("# changelog: ").strip()
    return heading, text[1:]


def changelog_headings() -> list[str]:
    return [
        line.lstrip("#").strip()
        for line in CHANGELOG.read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write docs/api-snapshot.txt")
    parser.add_argument("--changelog", help="the CHANGELOG.md heading (## ...) of the change")
    args = parser.parse_args()
    lines = api_lines()
    if not args.write:
        print("\n".join(lines))
        return 0
    if not args.changelog or args.changelog not in changelog_headings():
        print(
            "name the CHANGELOG.md heading that documents this API change with --changelog "
            f"(one of: {', '.join(changelog_headings())})",
            file=sys.stderr,
        )
        return 2
    SNAPSHOT.write_text(
        "\n".join([f"# changelog: {args.changelog}", *lines]) + "\n", encoding="utf-8"
    )
    print(f"wrote {SNAPSHOT.relative_to(ROOT)} ({len(lines)} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
