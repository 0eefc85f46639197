"""The hand-over strategy in the loader: ShareBy in the workers, the processes that are not workers, and reclaiming
what a stopped file_system loader leaves in /dev/shm (TunedDataModule's teardown included)."""

from __future__ import annotations

import dataclasses
import sys
import time

import lightning.pytorch as pl
import pytest
import torch
import torch.multiprocessing
from helpers import IndexData, RecordingModel, fake_hardware, trainer_kwargs
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import ShareBy, recommend_loader_settings
from lightning_dataperf.autotune.tune import AutotuneResult
from lightning_dataperf.loader.sharing import FAST_HANDOVER, _nested_pid_namespace, process_strategy, with_strategy

_INNER_CALLED: list[int] = []


#: Inside a container nothing is reclaimed (``sharing._nested_pid_namespace``): the tests that need it skip there.
needs_host_namespace = pytest.mark.skipif(
    _nested_pid_namespace(),
    reason="reclaim is off in a nested pid namespace (a container)",
)


class StrategyPerSample(Dataset):
    """Each sample: its index and the strategy the worker that made it sends with (1: file_system)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        sends = torch.multiprocessing.get_sharing_strategy() == FAST_HANDOVER
        return torch.tensor([index, int(sends), len(_INNER_CALLED)])


def _inner(worker_id: int) -> None:
    _INNER_CALLED.append(worker_id)


def test_share_by_sets_the_strategy_in_the_workers_only_and_keeps_their_init_and_the_order():
    before = process_strategy()
    loader = DataLoader(StrategyPerSample(), batch_size=4, num_workers=2, worker_init_fn=ShareBy(FAST_HANDOVER, _inner))
    rows = torch.cat(list(loader)).tolist()
    assert [row[0] for row in rows] == list(range(24))  # every sample once, in order
    assert all(row[1] == 1 for row in rows)  # made by workers that send by file name
    assert all(row[2] == 1 for row in rows)  # the loader's own worker_init_fn ran in each worker
    assert process_strategy() == before  # the training process is unchanged


def test_share_by_notes_its_workers_under_any_start_method_and_pickles_without_them():
    import pickle

    for context in ("fork", "spawn"):
        share = ShareBy(FAST_HANDOVER)
        samples = [torch.full((4,), float(index)) for index in range(16)]
        loader = DataLoader(samples, batch_size=4, num_workers=2, multiprocessing_context=context, worker_init_fn=share)
        assert torch.cat(list(loader))[:, 0].tolist() == [float(index) for index in range(16)]
        assert len(set(share.worker_pids())) == 2, context
    copy = pickle.loads(pickle.dumps(share))  # outside a worker's start: the pids stay with the original
    assert copy.strategy == FAST_HANDOVER and copy.worker_pids() == () and copy.reclaim() == 0
    assert ShareBy("file_descriptor").worker_pids() == ()


def test_the_resource_tracker_a_spawned_loader_leaves_is_not_taken_for_a_worker():
    from lightning_dataperf.telemetry import processes

    # the spawn context starts multiprocessing's resource tracker, a child alive as long as the process
    list(DataLoader(list(range(8)), batch_size=4, num_workers=1, multiprocessing_context="spawn"))
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker._pid
    assert tracker is not None and tracker in processes.child_pids(__import__("os").getpid())
    assert tracker not in [worker.pid for worker in processes.loader_worker_processes()]


def test_share_by_names_the_strategies_it_accepts():
    with pytest.raises(ValueError, match="sharing strategies are"):
        ShareBy("file_sytem")


def test_with_strategy_wraps_the_loaders_init_or_leaves_the_kwargs_alone():
    kwargs = {"num_workers": 2, "worker_init_fn": _inner}
    assert with_strategy(kwargs, None) == kwargs
    wrapped = with_strategy(kwargs, FAST_HANDOVER)["worker_init_fn"]
    assert isinstance(wrapped, ShareBy) and wrapped.inner is _inner and kwargs["worker_init_fn"] is _inner


class TearingDownData(IndexData):
    def teardown(self, stage):  # the user's own, without super()
        self.torn_down = stage


class Mixin:
    def teardown(self, stage):  # a mixin's, before TunedDataModule in the bases, without super()
        self.torn_down = stage


class MixedData(Mixin, IndexData):
    pass


@needs_host_namespace
@pytest.mark.parametrize(
    ("module_class", "persistent"), [(IndexData, True), (TearingDownData, False), (MixedData, True)]
)
def test_a_fit_cut_short_leaves_nothing_of_the_file_system_hand_over_in_dev_shm(
    tmp_path, monkeypatch, module_class, persistent
):
    import os

    policy = recommend_loader_settings(fake_hardware())
    settings = dataclasses.replace(policy, num_workers=2, prefetch_factor=4, persistent_workers=persistent)
    result = AutotuneResult(
        settings=settings, trials=(), search_seconds=1.0, baseline_batches_per_sec=1.0, best_batches_per_sec=1.3,
        chosen_batches_per_sec=1.0, sharing_strategy=FAST_HANDOVER, sharing_detail="file_system sharing measured +30%",
    )  # fmt: skip
    monkeypatch.setattr("lightning_dataperf.datamodule.tuning.autotune_for_datamodule", lambda module, explicit: result)
    # the deprecated spelling (kept for one release) is SearchTuning(): the search's result applies the same way
    with pytest.warns(DeprecationWarning, match=r"write TunedDataModule\(autotune=SearchTuning\(\)\)"):
        module = module_class(length=4000, seed=5, workers=2, autotune=True, verbose=False)
    trainer = pl.Trainer(max_epochs=2, limit_train_batches=3, logger=False, **trainer_kwargs(tmp_path))
    trainer.fit(RecordingModel(), datamodule=module)
    (share,) = module._sharing
    pids = share.worker_pids()
    assert len(pids) == 2 * (1 if settings.persistent_workers else 2)  # each epoch cut short: batches in flight
    left = [name for name in os.listdir("/dev/shm") if name.startswith(tuple(f"torch_{pid}_" for pid in pids))]
    assert left == []  # PyTorch leaves them until the process exits (16 a fit, 4 workers x prefetch 4)
    assert getattr(module, "torn_down", "fit") == "fit"  # the user's teardown still ran


def test_the_shared_memory_manager_is_not_taken_for_a_loader_worker(monkeypatch):
    # the manager is a child of the process that started it until it is re-parented (timing-dependent), so a
    # plain child stands in for it: the name decides
    import subprocess
    import types

    import psutil

    from lightning_dataperf.autotune.measures import WorkerCpu
    from lightning_dataperf.telemetry import processes

    assert processes.is_shm_manager(types.SimpleNamespace(name=lambda: "torch_shm_manag"))
    assert not processes.is_shm_manager(psutil.Process())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    other = subprocess.Popen(["sleep", "30"])  # another program (mpi4py's MPI_Init starts orted): no worker
    try:
        assert other.pid not in [worker.pid for worker in processes.loader_worker_processes()]
        assert other.pid not in [worker.pid for worker in WorkerCpu()._children()]
        assert child.pid in [worker.pid for worker in processes.loader_worker_processes()]
        assert child.pid in [worker.pid for worker in WorkerCpu()._children()]
        monkeypatch.setattr(processes, "is_shm_manager", lambda process: process.pid == child.pid)
        assert child.pid not in [worker.pid for worker in processes.loader_worker_processes()]
        assert child.pid not in [worker.pid for worker in WorkerCpu()._children()]
    finally:
        for process in (child, other):
            process.kill()
            process.wait()


_STOPPED_LOADER = """
import gc, os, sys
import torch
from torch.utils.data import DataLoader
from lightning_dataperf import ShareBy
from lightning_dataperf._lightning_hooks import shutdown_loader_iterator
from lightning_dataperf.loader.sharing import reclaim_segments

loader = DataLoader([torch.full((64,), float(i)) for i in range(512)], batch_size=4, num_workers=2, prefetch_factor=4,
                    worker_init_fn=ShareBy("file_system"))
iterator = iter(loader)
held = [next(iterator) for _ in range(3)]  # received, still used
pids = shutdown_loader_iterator(iterator)
del iterator
gc.collect()

def ours():  # the stopped workers' files
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(tuple(f"torch_{pid}_" for pid in pids)))

left = ours()
assert left, "PyTorch no longer leaves a stopped file_system loader's batches in /dev/shm"
removed = reclaim_segments(pids)
assert removed > 0
after = ours()
assert len(after) == len(left) - removed and len(after) <= 3, (left, after)  # at most the held batches' files
assert [batch[0, 0].item() for batch in held] == [0.0, 4.0, 8.0]
del held
gc.collect()  # freeing a held batch whose file was removed would abort the process
assert ours() == []
print("reclaimed", removed)
"""


_TWO_RANKS = """
import gc, os, time, multiprocessing as mp, torch
from torch.utils.data import DataLoader
from lightning_dataperf import ShareBy
from lightning_dataperf._lightning_hooks import shutdown_loader_iterator

share = ShareBy("file_system")  # made before the ranks start (a notebook, ddp_fork): one pid file for both

def rank(index, ready, go):
    loader = DataLoader([torch.full((64,), float(i)) for i in range(64)], batch_size=4, num_workers=2,
                        worker_init_fn=share)
    iterator = iter(loader)
    held = next(iterator)  # still used by this rank
    shutdown_loader_iterator(iterator)
    del iterator
    gc.collect()
    ready.set()
    go.wait()
    if index == 0:
        print("rank 0 reclaimed", share.reclaim(), "of its own", len(share.worker_pids()), flush=True)
    else:
        del held
        gc.collect()  # would abort had rank 0 removed this batch's file
        print("rank 1 freed its batch", flush=True)

context = mp.get_context("fork")
events = [(context.Event(), context.Event()) for _ in range(2)]
ranks = [context.Process(target=rank, args=(index, *events[index])) for index in range(2)]
for process in ranks:
    process.start()
for ready, _ in events:
    ready.wait()
events[0][1].set()
time.sleep(1.0)  # rank 0 reaches teardown first
events[1][1].set()
for process in ranks:
    process.join()
print("exit codes", [process.exitcode for process in ranks])
"""


@needs_host_namespace
def test_one_ranks_reclaim_never_removes_a_batch_another_rank_holds():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TWO_RANKS], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "exit codes [0, 0]" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "of its own 2" in done.stdout  # each rank reads only the workers it started


@needs_host_namespace
def test_a_stopped_file_system_loaders_unreceived_batches_are_removed_and_held_ones_kept():
    import subprocess
    import sys

    # a separate process: if a held batch's file were removed, freeing the batch would abort it
    command = [sys.executable, "-c", _STOPPED_LOADER]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("reclaimed ")


@needs_host_namespace
def test_a_share_by_collected_with_its_loader_reclaims_and_removes_its_pid_file():
    import gc
    import os

    from lightning_dataperf._lightning_hooks import shutdown_loader_iterator

    share = ShareBy(FAST_HANDOVER)
    loader = DataLoader([torch.full((8,), 1.0)] * 256, batch_size=4, num_workers=2, prefetch_factor=4,
                        worker_init_fn=share)  # fmt: skip

    def left(pids):
        return [name for name in os.listdir("/dev/shm") if name.startswith(tuple(f"torch_{pid}_" for pid in pids))]

    iterator = iter(loader)
    assert next(iterator).shape == (4, 8)
    # stopped only once both workers have batches waiting (prefetched, sent, not received): on a busy machine the
    # second worker may not have sent one yet when the first batch arrives
    deadline = time.monotonic() + 30
    while len({name.split("_")[1] for name in left(share.worker_pids())}) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    pids, pid_file = shutdown_loader_iterator(iterator), share._pid_file
    assert set(share.worker_pids()) == set(pids) and os.path.exists(pid_file)
    assert left(pids), "PyTorch no longer leaves a stopped file_system loader's batches in /dev/shm"
    del iterator, loader, share  # e.g. reload_dataloaders_every_n_epochs: the old loader goes
    gc.collect()
    assert left(pids) == [] and not os.path.exists(pid_file)


def test_reclaim_touches_only_the_stopped_workers_unmapped_files(tmp_path, monkeypatch):
    from lightning_dataperf.loader import sharing

    for name in ("torch_101_7_1", "torch_101_8_2", "torch_1010_9_1", "torch_202_1_1", "torch_303_1_1", "other_101_1"):
        (tmp_path / name).write_bytes(b"x")
    monkeypatch.setattr(sharing, "_nested_pid_namespace", lambda: False)
    monkeypatch.setattr(sharing, "pid_exists", lambda pid: pid == 303)  # 303 still runs: its files are in use
    monkeypatch.setattr(sharing, "_torch_files_in_use", lambda: ({"torch_101_8_2"}, set()))  # a batch still held
    assert sharing.reclaim_segments([101, 303], shm_dir=str(tmp_path)) == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "other_101_1", "torch_1010_9_1", "torch_101_8_2", "torch_202_1_1", "torch_303_1_1"
    ]  # fmt: skip
    # a container's process numbered 202 in its own namespace: torch_202_* may be its, in flight
    monkeypatch.setattr(sharing, "_torch_files_in_use", lambda: (set(), {202}))
    assert sharing.reclaim_segments([202], shm_dir=str(tmp_path)) == 0 and (tmp_path / "torch_202_1_1").exists()
    monkeypatch.setattr(sharing, "_torch_files_in_use", lambda: None)  # cannot tell what is held: nothing removed
    assert sharing.reclaim_segments([202], shm_dir=str(tmp_path)) == 0 and (tmp_path / "torch_202_1_1").exists()
    assert sharing.reclaim_segments([], shm_dir=str(tmp_path)) == 0
    monkeypatch.setattr(sharing, "_torch_files_in_use", lambda: (set(), set()))
    monkeypatch.setattr(sharing, "_nested_pid_namespace", lambda: True)  # in a container: names cannot tell whose
    assert sharing.reclaim_segments([202], shm_dir=str(tmp_path)) == 0 and (tmp_path / "torch_202_1_1").exists()
    monkeypatch.setattr(sharing, "_nested_pid_namespace", lambda: False)
    monkeypatch.setattr(sharing.sys, "platform", "win32")  # no /dev/shm, and os.kill(pid, 0) would not probe there
    assert sharing.reclaim_segments([202], shm_dir=str(tmp_path)) == 0 and (tmp_path / "torch_202_1_1").exists()
    monkeypatch.setattr(sharing.sys, "platform", "linux")
    assert sharing.reclaim_segments([202], shm_dir=str(tmp_path)) == 1  # nothing holds it: removed


def test_the_files_mapped_by_any_process_are_read_by_name_whatever_the_path(tmp_path):
    import mmap
    import os

    from lightning_dataperf.loader import sharing

    linked = tmp_path / "shm"
    linked.mkdir()
    (linked / "torch_1_2_3").write_bytes(b"x" * 4096)
    with open(linked / "torch_1_2_3", "r+b") as handle, mmap.mmap(handle.fileno(), 4096):
        assert "torch_1_2_3" in sharing._torch_files_in_use()[0]  # mapped from outside /dev/shm (a link, say)
    assert "torch_1_2_3" not in sharing._torch_files_in_use()[0]
    assert os.getpid() > 0
