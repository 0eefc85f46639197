"""The package's import graph: no circle between modules, and packages import one way (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "lightning_dataperf"

#: Low to high: a package imports only from packages before it (the top-level modules are below them all).
LAYERS = [
    "telemetry",
    "loader",
    "transfer",
    "decode",
    "timing",
    "diagnosis",
    "autotune",
    "report",
    "callback",
    "datamodule",
]
TOP_LEVEL = {"tags", "batches", "_lightning_hooks", "_lazy", "_registration", "_records"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (module level, functions and ``TYPE_CHECKING``)."""
    modules = {_module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_dataperf"):
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.startswith("lightning_dataperf")]
            else:
                continue
            # `from pkg import module` names a module; `from pkg.module import name` names its module
            edges |= {target for target in targets[:1] if target in modules} or {t for t in targets if t in modules}
        graph[name] = edges - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = 2, stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_module_imports_in_a_circle():
    assert _cycle(import_graph()) is None


def test_packages_import_one_way_in_the_stated_layer_order():
    wrong = []
    for module, edges in import_graph().items():
        source = _package(module)
        for target in edges:
            dest = _package(target)
            if source is None and module.split(".")[-1] in TOP_LEVEL and dest is not None:
                wrong.append(f"{module} -> {target} (a shared top-level module imports a package)")
            elif source and dest and source != dest and LAYERS.index(dest) > LAYERS.index(source):
                wrong.append(f"{module} -> {target} ({source} is below {dest})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_check_sees_a_circle_and_a_layer_broken():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("limit", [400])
def test_no_module_is_over_400_lines_and_no_folder_over_20_modules(limit):
    long = [
        f"{path.relative_to(ROOT)}: {n}"
        for path in ROOT.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > limit
    ]
    assert not long, long
    crowded = [str(d) for d in {p.parent for p in ROOT.rglob("*.py")} if len(list(d.glob("*.py"))) > 20]
    assert not crowded, crowded
