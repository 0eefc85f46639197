"""Writing DataPerf's metrics to the Trainer's loggers without slowing the training loop (docs/report.md).

TensorBoard gets one event per log point: its own ``log_metrics`` costs a thread hand-off per scalar.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lightning.pytorch.loggers import Logger, TensorBoardLogger

from lightning_dataperf._lightning_hooks import tensorboard_prefixed

__all__ = ["log_metrics"]


def log_metrics(loggers: Iterable[Logger], metrics: Mapping[str, float], step: int) -> None:
    """Log ``metrics`` at ``step`` to every logger (call on global rank zero only).

    Example::

        log_metrics(trainer.loggers, {"Time/DataLoading": 0.012, "Time/Compute": 0.030}, step=100)
    """
    if not metrics:
        return
    for logger in loggers:
        # TensorBoard's log_metrics hands each scalar to its flush thread apart; one event is one hand-off.
        if not (isinstance(logger, TensorBoardLogger) and _write_one_event(logger, metrics, step)):
            logger.log_metrics(dict(metrics), step=step)


def _write_one_event(logger: TensorBoardLogger, metrics: Mapping[str, float], step: int) -> bool:
    """Write all scalars as one TensorBoard event; ``False`` when this writer cannot take one."""
    try:  # torch's writer (Lightning's choice when tensorboard is installed); not tensorboardX's protos
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return False
    writer = logger.experiment
    file_writer = writer.file_writer if isinstance(writer, SummaryWriter) else None
    if file_writer is None:  # closed; log_metrics reopens it
        return False

    values = [
        Summary.Value(tag=tag, simple_value=float(value))
        for tag, value in tensorboard_prefixed(logger, metrics).items()
    ]
    file_writer.add_summary(Summary(value=values), step)
    return True
