"""Hardware probe parsing (cgroup, SLURM, mounts) and the pre-flight checks, each bad setting once."""

from __future__ import annotations

import dataclasses
import warnings

import lightning.pytorch as pl
import pytest
import torch
from helpers import IndexData, RecordingModel, SleepyModel, fake_hardware, sleepy_loader, trainer_kwargs
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.loader import preflight as preflight_module
from lightning_dataperf.loader.preflight import BatchFootprint, check_batch, check_loader
from lightning_dataperf.telemetry.hardware import (
    GpuInfo,
    cgroup_cpu_limit,
    local_world_size,
    pcie_capacity_mbps,
    probe_hardware,
    probe_storage,
    slurm_cpu_limit,
    usable_cpus,
)
from lightning_dataperf.testing import SleepingLoaderDataset

MB = 2**20


def loader(**kwargs) -> DataLoader:
    return DataLoader(SleepingLoaderDataset(8), batch_size=2, **kwargs)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "250000 100000\n"}, 2.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "400000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 4.0),
        ({}, None),
    ],
)
def test_cgroup_quota_parsing(tmp_path, files, expected):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert cgroup_cpu_limit(tmp_path) == expected


def test_usable_cpus_takes_the_tightest_limit(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert usable_cpus(tmp_path) == (1, "cgroup CPU quota")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path) == (4, "CPU affinity")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert usable_cpus(tmp_path) == (3, "SLURM_CPUS_PER_TASK")


def test_slurm_and_local_world_size_variables():
    assert slurm_cpu_limit({"SLURM_CPUS_PER_TASK": "6"}) == 6
    assert slurm_cpu_limit({"SLURM_CPUS_PER_TASK": "junk"}) is None
    assert slurm_cpu_limit({}) is None
    assert local_world_size({"LOCAL_WORLD_SIZE": "8"}) == 8
    assert local_world_size({"SLURM_NTASKS_PER_NODE": "4(x2)"}) == 4
    assert local_world_size({}) == 1
    assert fake_hardware(usable_cpus=16, local_world_size=8).cpus_per_rank == 2


def test_storage_from_a_mounts_table(tmp_path):
    mounts = tmp_path / "mounts"
    data = tmp_path / "data"
    data.mkdir()
    mounts.write_text(f"/dev/vda1 / ext4 rw 0 0\nserver:/export {tmp_path} nfs4 rw 0 0\n")
    storage = probe_storage(data, mounts_file=str(mounts))
    assert storage.filesystem == "nfs4" and storage.network and storage.kind == "network"


def test_probe_hardware_on_this_machine(tmp_path):
    found = probe_hardware(tmp_path)
    assert 1 <= found.usable_cpus <= found.logical_cpus
    assert found.ram_available_mb > 0 and found.storage is not None
    assert found.to_dict()["cpus_per_rank"] == found.cpus_per_rank


def test_pcie_capacity():
    assert pcie_capacity_mbps(GpuInfo(0, "H200", pcie_generation=5, pcie_width=16)) == pytest.approx(63_008)
    assert pcie_capacity_mbps(GpuInfo(0, "unknown")) is None


def test_more_workers_than_cpus_and_fork_after_cuda():
    problems = check_loader(
        loader(num_workers=6), fake_hardware(usable_cpus=8, local_world_size=2), cuda_initialized=True
    )
    kinds = {problem.check: problem.message for problem in problems}
    assert "this rank may use 4 CPUs" in kinds["workers_exceed_cpus"]
    assert "num_workers<=3" in kinds["workers_exceed_cpus"]
    assert "multiprocessing_context='spawn'" in kinds["fork_after_cuda"]
    spawned = loader(num_workers=2, multiprocessing_context="spawn")
    assert check_loader(spawned, fake_hardware(), cuda_initialized=True) == []
    assert check_loader(loader(num_workers=0), fake_hardware(usable_cpus=1), cuda_initialized=True) == []


def test_shm_open_files_and_pinned_ram(monkeypatch):
    batch = {"image": torch.zeros(64, 3, 224, 224), "label": torch.zeros(64, dtype=torch.long)}
    footprint = BatchFootprint.of(batch)
    assert footprint.tensors == 2 and footprint.bytes == 64 * 3 * 224 * 224 * 4 + 64 * 8
    cramped = fake_hardware(shm_free_mb=64.0, ram_available_mb=200.0)
    monkeypatch.setattr(preflight_module, "open_file_limit", lambda: 64)
    monkeypatch.setattr(torch.multiprocessing, "get_sharing_strategy", lambda: "file_descriptor")
    problems = check_batch(footprint, loader(num_workers=4, prefetch_factor=4, pin_memory=True), cramped)
    messages = {problem.check: problem.message for problem in problems}
    assert set(messages) == {"shm_too_small", "open_files", "pinned_ram"}
    assert "--shm-size" in messages["shm_too_small"] and "588 MB" in messages["shm_too_small"]
    assert "ulimit -n" in messages["open_files"]
    assert "power-of-two" in messages["pinned_ram"]
    roomy = dataclasses.replace(cramped, shm_free_mb=100_000.0, ram_available_mb=100_000.0)
    monkeypatch.setattr(preflight_module, "open_file_limit", lambda: 1_000_000)
    assert check_batch(footprint, loader(num_workers=4, pin_memory=True), roomy) == []


def test_callback_warns_at_fit_start(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "lightning_dataperf.callback.callback.probe_hardware", lambda *args, **kwargs: fake_hardware(usable_cpus=1)
    )
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], logger=False, **trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match=r"pre-flight \[workers_exceed_cpus\]"):
        trainer.fit(SleepyModel(), sleepy_loader(8, 4, 0.0, num_workers=2))
    assert [problem.check for problem in perf.preflight_problems] == ["workers_exceed_cpus"]


def test_explicit_workers_over_budget_are_warned_about_once_with_tuned_datamodule(tmp_path, monkeypatch):
    cramped = fake_hardware(usable_cpus=1)
    monkeypatch.setattr("lightning_dataperf.callback.callback.probe_hardware", lambda *args, **kwargs: cramped)
    monkeypatch.setattr("lightning_dataperf.datamodule.datamodule.probe_hardware", lambda *args, **kwargs: cramped)
    perf = DataPerfCallback(print_summary=False)
    datamodule = IndexData(length=16, workers=2, verbose=False)  # num_workers=2 passed explicitly, 1 CPU
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], logger=False, **trainer_kwargs(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(RecordingModel(), datamodule=datamodule)
    over_budget = [str(w.message) for w in caught if "num_workers=2" in str(w.message) and "CPUs" in str(w.message)]
    assert len(over_budget) == 1 and over_budget[0].startswith("DataLoader(num_workers=2)"), over_budget
    assert "workers_exceed_cpus" not in [problem.check for problem in perf.preflight_problems]
