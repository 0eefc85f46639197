from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
#: ``--import-mode=importlib`` (pyproject) leaves sys.path alone: the test modules in tests/<package>/ import
#: ``helpers`` (and ``scripts.*``) from here, and the examples' modules by name.
sys.path.insert(0, str(HERE.parent / "examples"))
sys.path.insert(0, str(HERE))


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_cuda)


@pytest.fixture
def no_leaked_threads():
    """Fail if a test leaves a non-daemon or dataperf thread running."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive() and "dataperf" in t.name]
    assert not leaked, f"threads left behind: {leaked}"
