"""The examples' docstrings (shown by their --help) name exactly the options the scripts have."""

from __future__ import annotations

import ast
import re

import pytest
from helpers import ROOT

EXAMPLES = ["quickstart.py"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_docstring_names_the_real_options(name):
    source = (ROOT / "examples" / name).read_text()
    tree = ast.parse(source)
    docstring = ast.get_docstring(tree) or ""
    options = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) == "add_argument"
        and isinstance(node.args[0], ast.Constant)
    }
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", docstring))
    assert named <= options, f"{name}'s docstring names options it does not have: {sorted(named - options)}"
    assert options <= named, f"{name}'s docstring leaves out {sorted(options - named)}"
    assert "``" not in docstring, "the docstring is the --help text: plain text, no reST markup"
