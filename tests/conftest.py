from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


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


def ddp_kwargs(tmp_path, **overrides):
    """Two-rank DDP options for the torch.distributed.run scripts: gloo on the CPU by default, or NCCL on
    two GPUs with ``DATAPERF_DDP_ACCELERATOR=cuda`` (the multi-GPU validation in benchmarks/README.md)."""
    accelerator = os.environ.get("DATAPERF_DDP_ACCELERATOR", "cpu")
    return trainer_kwargs(tmp_path, accelerator=accelerator, devices=2, strategy="ddp", **overrides)


def trainer_kwargs(tmp_path, **overrides):
    kwargs = dict(
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
        num_sanity_val_steps=0,
    )
    kwargs.update(overrides)
    return kwargs
