"""The documents a user reads: every link in README.md and docs/*.md resolves (file and heading), the README's usage
example comes early, and no document speaks of the project's internal tracking (issue numbers) a user never sees."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _links(path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_the_slug_is_github_s():
    assert _slug("1. The policy") == "1-the-policy"
    assert _slug("Tuning") == "tuning" and _slug("GPU decode") == "gpu-decode"
    assert _slug("OnlineTuning: on the training steps") == "onlinetuning-on-the-training-steps"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_link_resolves(document):
    broken = []
    for target in _links(document):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        name, _, anchor = target.partition("#")
        linked = (document.parent / name).resolve() if name else document
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, f"{document.name}: {broken}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_no_internal_tracking_words(document):
    text = document.read_text()
    found = re.findall(r"\b(?:issues? \d+|source article|the brief|sessions? \d+)\b", text, flags=re.I)
    assert not found, f"{document.name} speaks of {found}: words a user never sees"


def test_the_readme_shows_its_usage_early_and_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert "## Usage" in lines[:60], "the usage example within the first 60 lines"
    usage = lines.index("## Usage")
    assert any(line.startswith("```python") for line in lines[usage : usage + 5])
    assert len(lines) <= 220, f"README.md is {len(lines)} lines: details go to docs/"
    assert max(len(line) for line in lines if line.startswith("|")) <= 160, "table cells stay short"
