"""What ``TunedDataModule`` did to a stage's loaders: printed once on rank zero and handed to every logger."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lightning_dataperf import tags
from lightning_dataperf.loader.settings import LoaderPlan

__all__ = ["publish_plans"]


def publish_plans(trainer: Any, stage: str, plans: list[LoaderPlan], verbose: bool) -> None:
    """Print ``plans`` (with ``verbose``) and log the chosen settings as hyperparameters, and as text on TensorBoard."""
    text = "\n".join(plan.format() for plan in plans)
    if verbose:
        _print_on_rank_zero(text)
    if trainer is None or not trainer.is_global_zero:
        return
    params = {f"dataperf/{stage}/{name}": value for plan in plans for name, value in plan.chosen.items()}
    for logger in trainer.loggers:
        if params:
            logger.log_hyperparams(params)
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(tags.loader_settings_text(stage), f"```\n{text}\n```")


@rank_zero_only
def _print_on_rank_zero(text: str) -> None:
    print(text, flush=True)
