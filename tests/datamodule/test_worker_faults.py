"""Issue 47's fault table (docs/faults.md): a loader worker that raises or dies in the middle of an online trial
stops the fit with an error naming the sample or the worker, and leaves no worker and the user's threads behind."""

from __future__ import annotations

import gc
import os
import signal

import lightning.pytorch as pl
import pytest
import torch
from helpers import RecordingModel, trainer_kwargs
from torch.utils.data import DataLoader, Dataset, get_worker_info

from lightning_dataperf import OnlineTuning, TunedDataModule
from lightning_dataperf.telemetry.processes import loader_worker_processes

#: every trial ends at its first 8 counted batches: the first trial (the start, 2 workers) is under way at batch 3
QUICK = OnlineTuning(precision=10.0, max_batches=8, max_cost=10.0, min_seconds=0.0)
FAULTY = 13  # in the fourth batch of four


class Faulty(Dataset):
    """Sample ``i`` is ``[i, 0, 0]``; sample :data:`FAULTY` raises or kills the worker that loads it."""

    def __init__(self, fault: str) -> None:
        self.fault = fault

    def __len__(self) -> int:
        return 240

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == FAULTY:
            if get_worker_info() is None:
                raise AssertionError("the faulty sample was loaded in the test's own process, not in a worker")
            if self.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError(f"cannot read sample {index}")
        return torch.tensor([float(index), 0.0, 0.0])


#: PyTorch's words for a dead worker; where the dead worker had sent a batch by file descriptor that was not received
#: yet, receiving it fails first, in multiprocessing's resource sharer (the same without this package)
DEAD_WORKER = r"DataLoader worker \(pid.*\) (is killed|exited unexpectedly)|Connection reset by peer"


@pytest.mark.parametrize(
    ("fault", "errors", "words"),
    [("raise", ValueError, r"cannot read sample 13"), ("kill", (RuntimeError, ConnectionResetError), DEAD_WORKER)],
)
def test_a_worker_that_fails_mid_trial_stops_the_fit_clearly_and_leaves_nothing(tmp_path, fault, errors, words):
    threads = torch.get_num_threads()
    loader = DataLoader(Faulty(fault), batch_size=4, num_workers=2)
    datamodule = TunedDataModule.from_loaders(loader, seed=5, verbose=False, autotune=QUICK)
    trainer = pl.Trainer(max_epochs=1, **trainer_kwargs(tmp_path))
    with pytest.raises(errors, match=words) as raised:
        trainer.fit(RecordingModel(), datamodule=datamodule)
    assert datamodule.online_result is not None and not datamodule.online_result.done, "stopped mid-search"
    # the traceback holds the loader's iterator, and its workers, as with Lightning's own loaders
    del raised
    gc.collect()
    assert not loader_worker_processes(), "no worker left once the error is let go"
    assert torch.get_num_threads() == threads
