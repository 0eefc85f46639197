"""What the README's install commands promise: the report's matplotlib comes with the base install, old
``[report]`` commands still resolve, ``[dev]`` pins the ruff CI checks with, README and CI agree."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
from helpers import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> dict[str, str]:
    return {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower(): requirement for requirement in requirements}


def test_matplotlib_is_a_base_dependency_and_report_extra_still_exists():
    project = _project()
    assert "matplotlib" in _names(project["dependencies"])
    assert "report" in project["optional-dependencies"]


def test_dev_extra_pins_the_installed_ruff_exactly():
    ruff = _names(_project()["optional-dependencies"]["dev"])["ruff"]
    assert re.fullmatch(r"ruff==\d+\.\d+\.\d+", ruff), ruff
    try:
        installed = importlib.metadata.version("ruff")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("ruff is not installed here")
    assert ruff == f"ruff=={installed}"


def test_readme_test_command_installs_what_ci_installs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    install = re.search(r"pip install -q (torch==[\d.]+ -e \"\.\[test,dev\]\")", ci).group(1)
    assert f"pip install {install} && python -m pytest -q" in readme
    assert "passed" not in readme.split("## Usage")[0], "no stale pass counts in the install section"
