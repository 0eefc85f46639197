"""The policy's ranks per node come from the trainer, not only from torchrun/SLURM variables (issue 47, item 5)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from helpers import IndexData, SleepyModel, trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.telemetry.hardware import local_world_size, probe_hardware


@pytest.fixture
def no_launcher_variables(monkeypatch):
    """As ``python train.py`` with ``Trainer(devices=2, strategy="ddp")`` leaves the environment."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)


def ddp_trainer(tmp_path, **options):
    # configured only: Lightning starts the second rank in fit, which these tests never call
    return pl.Trainer(logger=False, **trainer_kwargs(tmp_path, devices=2, strategy="ddp", **options))


def test_the_count_a_caller_knows_wins_over_the_environment():
    assert local_world_size({}, ranks=2) == 2
    assert local_world_size({"LOCAL_WORLD_SIZE": "8"}, ranks=4) == 4
    assert local_world_size({"LOCAL_WORLD_SIZE": "8"}) == 8


def test_probe_hardware_divides_the_cpus_among_the_ranks_it_is_told(no_launcher_variables):
    assert probe_hardware().local_world_size == 1
    hardware = probe_hardware(local_ranks=2)
    assert hardware.local_world_size == 2
    assert hardware.cpus_per_rank == max(1, hardware.usable_cpus // 2)


def test_the_datamodule_passes_the_trainers_devices(tmp_path, no_launcher_variables):
    trainer = ddp_trainer(tmp_path)
    assert trainer.num_devices == 2
    datamodule = IndexData(verbose=False)
    datamodule.trainer = trainer
    assert datamodule.hardware.local_world_size == 2
    assert "/ 2 local rank(s)" in datamodule.loader_settings.reasons["num_workers"]


def test_the_callback_passes_the_trainers_devices(tmp_path, no_launcher_variables):
    trainer = ddp_trainer(tmp_path)
    perf = DataPerfCallback(telemetry=False, hang_timeout=None, print_summary=False, write_json=False)
    perf.setup(trainer, SleepyModel(), "fit")
    try:
        assert perf.hardware is not None and perf.hardware.local_world_size == 2
    finally:
        perf.teardown(trainer, SleepyModel(), "fit")
