"""Lightning strategies that copy batches on a side CUDA stream, ahead of the step that needs them."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.utilities.model_helpers import is_overridden
from typing_extensions import override

from lightning_dataperf._lightning_hooks import accept_connector_devices, single_device_root
from lightning_dataperf.transfer.copier import (
    DEFAULT_MIN_BYTES,
    DEFAULT_TIMING_EVERY,
    DeviceTransform,
    SideStreamCopier,
    check_copy_options,
)
from lightning_dataperf.transfer.lookahead import LookaheadIterator, with_lookahead
from lightning_dataperf.transfer.stats import CopyTiming

__all__ = ["SideStreamDDPStrategy", "SideStreamStrategy", "SideStreamTransferMixin"]


class SideStreamTransferMixin:
    """Adds side-stream, look-ahead host-to-device copies to a Lightning strategy.

    Put it first in the bases of your own strategy: ``class MyStrategy(SideStreamTransferMixin, DDPStrategy)``.

    Args:
        lookahead: batches copied ahead of the one being computed (default 1). With ``lookahead >= 1``
            the loader yields batches already on the device, so ``on_before_batch_transfer`` and a custom
            ``transfer_batch_to_device`` see device tensors; ``on_after_batch_transfer`` is unchanged.
            ``lookahead=0`` keeps the stock hook order (copy on the side stream inside
            ``batch_to_device``) but overlaps only with work the GPU still has queued.
        pin: pin unpinned host tensors in the main process (see :class:`SideStreamCopier`).
        device_transform: runs on the side stream after each copy, e.g. uint8 -> float and normalise.
        min_bytes: smaller batches are copied the stock way, on the compute stream (default 2 MiB; see
            :class:`SideStreamCopier`).
        timing_every: time one side-stream copy in this many (default 4) for DataPerfCallback's figures.
        stock_when_host_bound: large batches take the stock copy while the GPU is idle at the hand-overs
            (a host-bound run, where the side stream hides nothing and costs host time; see
            :class:`~lightning_dataperf.transfer.regime.CopyRegime`). ``False``: always the side stream.

    Example::

        class MyStrategy(SideStreamTransferMixin, SingleDeviceStrategy):
            pass

        trainer = Trainer(accelerator="gpu", devices=1, strategy=MyStrategy(lookahead=2))
    """

    def __init__(
        self,
        *args: Any,
        lookahead: int = 1,
        pin: bool = True,
        device_transform: DeviceTransform | None = None,
        min_bytes: int = DEFAULT_MIN_BYTES,
        timing_every: int = DEFAULT_TIMING_EVERY,
        stock_when_host_bound: bool = True,
        **kwargs: Any,
    ) -> None:
        if lookahead < 0:
            raise ValueError(f"lookahead={lookahead} must be >= 0 (0 copies in batch_to_device, 1+ copies ahead).")
        check_copy_options(min_bytes, timing_every)  # here too: the copier itself is created on first use
        super().__init__(*args, **kwargs)
        self.lookahead = lookahead
        self.pin = pin
        self.device_transform = device_transform
        self.min_bytes = min_bytes
        self.timing_every = timing_every
        self.stock_when_host_bound = stock_when_host_bound
        self._copier: SideStreamCopier | None = None
        self._hooks_warned = False

    @property
    def side_stream_active(self) -> bool:
        return self.root_device.type == "cuda" and torch.cuda.is_available()  # type: ignore[attr-defined]

    @property
    def copier(self) -> SideStreamCopier:
        """The side-stream copier of this rank's device, created once for the run."""
        if self._copier is None:
            self._copier = SideStreamCopier(
                self.root_device,  # type: ignore[attr-defined]
                self.pin,
                self.device_transform,
                min_bytes=self.min_bytes,
                timing_every=self.timing_every,
                stock_when_host_bound=self.stock_when_host_bound,
            )
        return self._copier

    def completed_copies(self) -> list[CopyTiming]:
        """Copy timings completed since the last call (used by DataPerfCallback)."""
        return [] if self._copier is None else self._copier.completed()

    @override
    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)  # type: ignore[misc]
        # CPU and MPS runs keep Lightning's stock behaviour; lookahead=0 copies in batch_to_device.
        if not self.side_stream_active or self.lookahead == 0:
            return dataloader
        self._warn_about_hooks()

        def make_iterator(inner: Iterator) -> Iterator:
            return LookaheadIterator(inner, self.copier, self.lookahead)

        return with_lookahead(dataloader, make_iterator)

    @override
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        if self.side_stream_active and self.lookahead == 0 and (device is None or device == self.root_device):  # type: ignore[attr-defined]
            # Copied now, for this step: side-stream memory keeps the overlap with already queued work.
            batch = self.copier.hand_over(self.copier.issue(batch, allocate_on_compute=False))
        return super().batch_to_device(batch, device, dataloader_idx)  # type: ignore[misc]

    @override
    def teardown(self) -> None:
        # The copier, its stream and its events are per run: made again on first use.
        self._copier = None
        super().teardown()  # type: ignore[misc]

    def _warn_about_hooks(self) -> None:
        module = getattr(self, "lightning_module", None)
        if self._hooks_warned or module is None:
            return
        overridden = [
            name for name in ("on_before_batch_transfer", "transfer_batch_to_device") if is_overridden(name, module)
        ]
        if overridden:
            self._hooks_warned = True
            warnings.warn(
                f"{', '.join(overridden)} is overridden: with side-stream look-ahead it receives batches already on "
                "the GPU. Move host-side batch edits into the DataLoader's collate_fn, or use lookahead=0 to keep "
                "the stock hook order.",
                stacklevel=2,
            )


class SideStreamStrategy(SideStreamTransferMixin, SingleDeviceStrategy):
    """Single-device training with side-stream look-ahead copies. Registered as ``"side_stream"``.

    Example::

        Trainer(accelerator="gpu", devices=1, strategy="side_stream")
        Trainer(accelerator="gpu", devices=1, strategy=SideStreamStrategy(lookahead=2))
    """

    strategy_name = "side_stream"

    def __init__(self, device: Any = None, **kwargs: Any) -> None:
        # A placeholder: the accelerator connector assigns the real device (accept_connector_devices).
        super().__init__(device=device if device is not None else "cpu", **kwargs)
        self._device_given = device is not None
        accept_connector_devices(self)

    @property
    def root_device(self) -> torch.device:
        return single_device_root(self, self._device_given)


class SideStreamDDPStrategy(SideStreamTransferMixin, DDPStrategy):
    """DDP with side-stream look-ahead copies, one stream per rank's device. Registered as ``"ddp_side_stream"``.

    Example::

        Trainer(accelerator="gpu", devices=8, strategy="ddp_side_stream")
    """

    strategy_name = "ddp_side_stream"


def _register() -> None:
    """Register the classes (replacing the package's import-time factories, see ``lightning_dataperf.__init__``)."""
    for name, strategy, params in (
        ("side_stream", SideStreamStrategy, {}),
        # As Lightning's own "ddp" entry: ranks started as subprocesses of the script.
        ("ddp_side_stream", SideStreamDDPStrategy, {"start_method": "popen"}),
    ):
        current = dict.get(StrategyRegistry, name)  # the entry itself (StrategyRegistry.get builds a strategy)
        # Never replace a strategy that someone else registered under the same name.
        if current is None or getattr(current.get("strategy"), "_dataperf_deferred", False):
            StrategyRegistry.register(name, strategy, description=strategy.__doc__, override=True, **params)


_register()
