"""docs/faults.md: every test a row names exists (a renamed or removed test leaves no row unbacked)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def test_every_test_the_fault_table_names_exists():
    table = (ROOT / "docs" / "faults.md").read_text()
    named = NAMED.findall(table)
    assert len(named) >= 20
    missing = []
    for path, name in named:
        source = ROOT / path
        tree = ast.parse(source.read_text()) if source.is_file() else ast.Module(body=[], type_ignores=[])
        tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        if name not in tests:
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/faults.md names tests that do not exist: {missing}"
