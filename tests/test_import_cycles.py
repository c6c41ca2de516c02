"""lpq's packages import their own modules without cycles — lazy imports inside functions
count. Core and every adaptor and example plugin of this repository are checked.

A cycle held apart by a function-level import works until someone moves that import;
the layout (plan -> plugins -> tuning/strategy -> api/cli) is meant to make cycles
unnecessary. Imports under ``if TYPE_CHECKING:`` are ignored: they never run. The one
import by *name* (the plugin manager importing lpq's own plugin, like any entry point)
is not a static import and so not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
# Each package's source folder and import name: core is `lpq`, a plugin's folder is named
# after its package.
PACKAGES = {CORE: "lpq"} | {
    folder: folder.name
    for folder in sorted([*ROOT.glob("plugins/*/lpq_*"), *ROOT.glob("examples/*/lpq_*")])
    if folder.is_dir()
}


def module_name(path: Path, root: Path = CORE) -> str:
    parts = [PACKAGES[root], *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path, modules: set[str], root: Path = CORE) -> set[str]:
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if is_type_checking_block(child):
                continue
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in child.names:
                    candidate = f"{base}.{alias.name}"
                    found.add(candidate if candidate in modules else base)
            elif isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path = CORE) -> dict[str, set[str]]:
    files = [p for p in root.rglob("*.py") if not (root == CORE and "testing" in p.parts)]
    modules = {module_name(p, root) for p in files}
    return {module_name(p, root): imports_of(p, modules, root) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None


@pytest.mark.parametrize("root", sorted(PACKAGES), ids=lambda root: PACKAGES[root])
def test_package_has_no_import_cycle(root: Path):
    cycle = find_cycle(import_graph(root))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_adaptor_package_is_checked():
    names = set(PACKAGES.values())
    assert {"lpq", "lpq_onnxrt", "lpq_torch", "lpq_tf", "lpq_mxnet", "lpq_acme_npu"} <= names


def test_the_checker_finds_a_planted_cycle():
    graph = import_graph()
    graph["lpq.plan.tune_config"].add("lpq.tuning.driver")
    assert find_cycle(graph) is not None


def test_strategies_import_no_framework_and_no_plugin_machinery():
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("lpq.strategy"):
            assert not {d for d in deps if d.startswith(("lpq.plugins", "lpq.api", "lpq.cli"))}
