from __future__ import annotations

import gc
import multiprocessing.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: The session's temporary files (issue 39): the tests and every process they start (TMPDIR is inherited) write
#: their temporary files into this folder, listed when the session ends (:func:`leaves_no_files`) and removed.
#: Made before torch and Lightning are imported: importing Lightning creates torch's compile cache, sent here too.
SESSION_TMP = Path(tempfile.mkdtemp(prefix="dataperf-tests-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(SESSION_TMP / "torchinductor"))

import pytest  # noqa: E402
import torch  # noqa: E402

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


def _checkout_files() -> set[str]:
    """Untracked and ignored files in the checkout (caches of Python, pytest and ruff aside; sources and benchmark
    results aside: the suite writes neither, and other work in a shared checkout may add them meanwhile)."""
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--ignored"],
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    skip = ("__pycache__", ".pytest_cache", ".ruff_cache", ".venv/", ".egg-info/", ".whl", "benchmarks/results/")
    return {
        line[3:]
        for line in listed
        if line[:2] in ("??", "!!") and not any(part in line for part in skip) and not line.endswith((".py", ".md"))
    }


def _live_shm_manager_dirs() -> set[str]:
    """The folders of PyTorch's shared-memory managers still running (this process's: each removes its folder when
    the process it serves has exited)."""
    import psutil

    names = set()
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == "torch_shm_manager":
            try:
                names |= {Path(str(c.laddr)).parent.name for c in process.net_connections(kind="unix") if c.laddr}
            except psutil.Error:
                continue
    return names


def _left_in(folder: Path) -> list[str]:
    """What is in ``folder`` but torch's compile cache and the folders of shared-memory managers still running."""
    kept = {"torchinductor", *_live_shm_manager_dirs()}
    # Open MPI's session folder, made where a library of the machine's image initialises MPI (seen on the H200)
    return sorted(path.name for path in folder.iterdir() if path.name not in kept and not path.name.startswith("ompi."))


def pytest_unconfigure(config):
    shutil.rmtree(SESSION_TMP, ignore_errors=True)  # also where the session never started (a collection error)


@pytest.fixture(scope="session", autouse=True)
def leaves_no_files(tmp_path_factory):
    """Fail the run if it leaves a file outside pytest's temporary folder: in the temporary folder (every process
    of the run writes into :data:`SESSION_TMP`, listed here at the end) or new in the checkout."""
    tmp_path_factory.getbasetemp()  # pytest's own folder, where the system's temporary folder is
    multiprocessing.util.get_temp_dir()  # this process's own, removed when it exits: made outside SESSION_TMP
    checkout = _checkout_files() if (HERE.parent / ".git").exists() else None
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(SESSION_TMP)
    tempfile.tempdir = None  # recomputed from TMPDIR
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        tempfile.tempdir = None
    left = _left_in(SESSION_TMP)
    deadline = time.monotonic() + 10.0  # what exiting processes and collected objects remove may take a moment
    while left and time.monotonic() < deadline:
        gc.collect()  # e.g. a ShareBy no longer referenced removes its pid file
        time.sleep(0.2)
        left = _left_in(SESSION_TMP)
    new = sorted(_checkout_files() - checkout) if checkout is not None else []
    shutil.rmtree(SESSION_TMP, ignore_errors=True)
    assert not left, f"the run left these in the temporary folder (write under tmp_path instead): {left}"
    assert not new, f"the run left these in the checkout (write under tmp_path instead): {new}"
