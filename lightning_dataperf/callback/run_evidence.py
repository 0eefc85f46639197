"""The evidence for one epoch's verdict, gathered from a Lightning run."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lightning_dataperf._lightning_hooks import compiled_step
from lightning_dataperf.autotune.trial import rated
from lightning_dataperf.diagnosis.evidence import (
    STEP_COMPILED,
    STEP_COMPILED_CUDA_GRAPHS,
    STEP_CUDA_GRAPHS,
    DecodePlacementMeasured,
    Evidence,
    MoreWorkersMeasured,
)
from lightning_dataperf.loader.settings import LoaderFacts, first_loader
from lightning_dataperf.tags import Stage
from lightning_dataperf.telemetry.hardware import Hardware, pcie_capacity_of_device
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.timing.summary import EpochSummary
from lightning_dataperf.transfer.strategies import SideStreamTransferMixin

__all__ = [
    "autotune_seconds",
    "autotune_words",
    "decode_placement_measured",
    "gather_evidence",
    "more_workers_measured",
    "online_words",
    "step_compiled_words",
]


def gather_evidence(
    trainer: pl.Trainer,
    summary: EpochSummary,
    system: SystemStats,
    hardware: Hardware | None,
    loader_blind: str | None = None,
) -> Evidence:
    """Everything the verdict may use about this epoch: the stage's own loader, telemetry, hardware, autotune.

    Example::

        evidence = gather_evidence(trainer, summary, system=sampler.epoch_means(), hardware=hardware)
        diagnose(evidence)
    """
    stage = Stage(summary.stage)
    max_epochs = trainer.max_epochs
    tuned = getattr(trainer.datamodule, "autotune_result", None)
    online = getattr(trainer.datamodule, "online_result", None)
    return Evidence(
        summary=summary,
        loader=LoaderFacts.of(first_loader(_stage_loaders(trainer, stage))),
        system=system,
        side_stream_transfer=isinstance(trainer.strategy, SideStreamTransferMixin),
        usable_cpus=None if hardware is None else hardware.cpus_per_rank,
        pcie_capacity_mbps=pcie_capacity_of_device(hardware, trainer.strategy.root_device),
        planned_epochs=max_epochs if max_epochs is not None and max_epochs > 0 else None,
        autotune=autotune_words(tuned) if stage is Stage.TRAIN else None,
        autotune_more=more_workers_measured(tuned) if stage is Stage.TRAIN else None,
        loader_blind=loader_blind,
        measured_online=online_words(online) if stage is Stage.TRAIN else None,
        intra_op_threads=torch.get_num_threads(),
        step_compiled=step_compiled_words(trainer.lightning_module),
        decode_placement=decode_placement_measured(online) if stage is Stage.TRAIN else None,
    )


def _stage_loaders(trainer: pl.Trainer, stage: Stage) -> Any:
    """The loaders of one stage as the Trainer holds them (a CombinedLoader, a loader, a list, or None)."""
    loaders = {
        Stage.TRAIN: trainer.train_dataloader,
        Stage.VAL: trainer.val_dataloaders,
        Stage.TEST: trainer.test_dataloaders,
        Stage.PREDICT: trainer.predict_dataloaders,
    }[stage]
    return loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders


def online_words(result: Any) -> str | None:
    """What ``TunedDataModule(autotune="online")`` measured on this run's steps (``None``: it did not run)."""
    return None if result is None or not result.trials else str(result.summary())


def autotune_words(result: Any) -> str | None:
    """Autotune's measured choice in words (``AutotuneResult.summary_line``), when it ran."""
    return None if result is None else str(result.summary_line())


def more_workers_measured(result: Any) -> MoreWorkersMeasured | None:
    """The fastest trial with more workers than autotune's pick, against the pick (``None``: none measured)."""
    if result is None or not result.chosen_batches_per_sec:
        return None
    pick = result.settings.num_workers
    above = [trial for trial in rated(result.trials) if trial.num_workers > pick]
    if not above:
        return None
    fastest = max(above, key=lambda trial: trial.batches_per_sec)
    return MoreWorkersMeasured(pick, fastest.num_workers, fastest.batches_per_sec / result.chosen_batches_per_sec - 1)


def autotune_seconds(result: Any) -> float:
    """What the autotune call cost this run: probe + search, or the cache lookup (``AutotuneResult.elapsed_s``)."""
    return float(result.elapsed_s)


def step_compiled_words(module: torch.nn.Module | None) -> str | None:
    """How the LightningModule's step runs, in the verdict's words (``None``: eager, or no module).

    Example::

        # a LightningModule holding self.net = torch.compile(net, mode="reduce-overhead")
        step_compiled_words(model)   # "torch.compile (CUDA graphs)"
    """
    how = None if module is None else compiled_step(module)
    if how is None:
        return None
    if how.compiled:
        return STEP_COMPILED_CUDA_GRAPHS if how.cuda_graphs else STEP_COMPILED
    return STEP_CUDA_GRAPHS


def decode_placement_measured(result: Any) -> DecodePlacementMeasured | None:
    """The online loop's fastest trial at ``gpu_share=0`` and at ``gpu_share=1`` (``None``: not both measured).

    Example::

        decode_placement_measured(datamodule.online_result)   # DecodePlacementMeasured(cpu_only=48.0, ...)
    """
    ends = {} if result is None else result.share_ends
    if len(ends) < 2:
        return None
    kept = result.kept
    kept_share = None if kept is None else kept.setting.gpu_share
    return DecodePlacementMeasured(
        cpu_only=ends[0.0].steps_per_sec,
        gpu_only=ends[1.0].steps_per_sec,
        cpu_only_error=ends[0.0].error,
        gpu_only_error=ends[1.0].error,
        cpu_only_workers=ends[0.0].setting.num_workers,
        kept_share=kept_share,
        kept=None if kept_share is None else kept.steps_per_sec,
    )
