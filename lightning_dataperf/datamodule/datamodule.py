"""TunedDataModule: DataLoader settings from the hardware, and seeded, resume-exact sampling (docs/datamodule.md)."""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_dataperf._lightning_hooks import resume_position
from lightning_dataperf._records import changed, keywords
from lightning_dataperf.autotune.online import OnlineResult
from lightning_dataperf.autotune.options import OnlineTuning, SearchTuning
from lightning_dataperf.datamodule._options import Tuning, decode_options, tuning_mode
from lightning_dataperf.datamodule._reporting import publish_plans
from lightning_dataperf.datamodule.from_loaders import TrainLoaders, TrainValLoaders
from lightning_dataperf.datamodule.hooks import TunedHooks, reclaims_itself
from lightning_dataperf.datamodule.online import OnlineTuner
from lightning_dataperf.datamodule.online_start import attach_online, machine_words, online_off
from lightning_dataperf.datamodule.samplers import Sharding, plan_sampler
from lightning_dataperf.datamodule.threads import ThreadsBeside
from lightning_dataperf.decode.encoded import encoded_loader_defaults, is_encoded_dataset
from lightning_dataperf.decode.loader import GpuDecodeLoader
from lightning_dataperf.decode.options import GpuDecodeOptions
from lightning_dataperf.loader.in_process import with_timed_workers
from lightning_dataperf.loader.policy import check_loader_kwargs, iterable_workers, recommend_loader_settings
from lightning_dataperf.loader.sampler import EpochAwareDistributedSampler, make_resumable
from lightning_dataperf.loader.seeding import (
    MAIN_PROCESS_SEEDING,
    EpochSeededWorkerInit,
    SharedEpoch,
    seed_batches_in_main_process,
)
from lightning_dataperf.loader.settings import POLICY_FIELDS, LoaderPlan, LoaderSettings
from lightning_dataperf.loader.sharing import ShareBy, with_strategy
from lightning_dataperf.telemetry.hardware import Hardware, probe_hardware, trainer_ranks

__all__ = ["LoaderPlan", "TunedDataModule"]


class TunedDataModule(TunedHooks, pl.LightningDataModule):
    """A ``LightningDataModule`` whose DataLoaders get tuned settings and seeded, resume-exact sampling.

    Args:
        seed: the sampling and worker seed; default ``seed_everything``'s (``PL_GLOBAL_SEED``), else 0.
        shard_drop_last: trim the training set so it divides evenly across ranks instead of repeating
            samples (``DistributedSampler(drop_last=...)``).
        unpadded_eval: shard validation/test loaders without padding, so distributed metrics count
            every sample exactly once (ranks may then run one step fewer).
        data_path: where the data lives, to take the storage into account.
        autotune: :class:`~lightning_dataperf.OnlineTuning`: start from the policy's settings and try neighbouring
            ones (workers, prefetch, pinning on CUDA, the training process's intra-op threads on CPU) on the
            training steps themselves, keeping the fastest (:attr:`online_result`); samples and their order are
            unchanged. :class:`~lightning_dataperf.SearchTuning`: measure loader settings on the real training set
            before training (:func:`lightning_dataperf.autotune_loader`, :attr:`autotune_result`). ``None``: the
            policy's settings. On CPU (and for the loop's start on one rank) the policy's workers come from two
            batches timed here as the loader is built (docs/loader.md, section 1). (``True``, ``"online"`` and
            ``autotune_options``: deprecated.)
        verbose: print the chosen settings and reasons once on rank zero.
        intra_op_threads: CPU training: ``"auto"`` cuts ``torch.set_num_threads`` where the training loader's workers
            and the intra-op threads would outnumber the cores; an ``int`` sets it; ``None``: left alone.
        gpu_decode: decode JPEGs on the GPU with these :class:`~lightning_dataperf.GpuDecodeOptions`, e.g.
            ``GpuDecodeOptions(size=224, dtype=torch.bfloat16)``: a hook's single loader over an
            :class:`~lightning_dataperf.decode.encoded.EncodedImageDataset` gets ``collate_fn=collate_encoded``,
            at most 4 workers unless you say (they only read files) and comes back wrapped in a
            ``GpuDecodeLoader``; the step receives ``(images, labels)`` on the run's device (docs/gpu_decode.md).

    Example::

        class MyData(TunedDataModule):
            def __init__(self):
                super().__init__(seed=42, autotune=SearchTuning(time_budget=20))  # or OnlineTuning()

            def train_dataloader(self):
                return DataLoader(self.train_set, batch_size=64, shuffle=True)

        datamodule = MyData()
        trainer.fit(model, datamodule=datamodule)
        print(datamodule.loader_plans["train"][0].format())   # what was chosen, and why

    Its own ``DistributedSampler`` and worker seeding replace Lightning's (docs/datamodule.md).
    """

    #: Read by DataPerfCallback: this module checks ``num_workers`` against the CPU budget itself.
    dataperf_checks_worker_budget = True

    def __init__(
        self,
        *,
        seed: int | None = None,
        shard_drop_last: bool = False,
        unpadded_eval: bool = False,
        data_path: str | os.PathLike[str] | None = None,
        autotune: OnlineTuning | SearchTuning | None = None,
        autotune_options: dict[str, Any] | None = None,
        verbose: bool = True,
        gpu_decode: GpuDecodeOptions | None = None,
        intra_op_threads: int | str | None = "auto",
    ) -> None:
        super().__init__()
        self._threads = ThreadsBeside(intra_op_threads)
        # the old spellings (True, "online", dicts) become records here, so a misspelt option fails now, not in fit
        self.autotune: Tuning = tuning_mode(autotune, autotune_options)
        self.gpu_decode = decode_options(gpu_decode)
        self.seed = seed
        self.shard_drop_last = shard_drop_last
        self.unpadded_eval = unpadded_eval
        self.data_path = data_path
        self.verbose = verbose
        self.loader_plans: dict[str, list[LoaderPlan]] = {}
        self.autotune_result: Any = None
        self._online: OnlineTuner | None = None
        self._online_off: OnlineResult | None = None
        self._hardware: Hardware | None = None
        self._settings: LoaderSettings | None = None
        self._reported: set[str] = set()
        self._sharing: weakref.WeakSet[ShareBy] = weakref.WeakSet()  # how its loaders send by file name (teardown)
        self._decoding: weakref.WeakSet[GpuDecodeLoader] = weakref.WeakSet()  # their threads stop at teardown

    @override
    @reclaims_itself
    def teardown(self, stage: str) -> None:
        """Once the loaders stopped: what their workers sent by file name and nobody received is removed
        (:meth:`~lightning_dataperf.loader.sharing.ShareBy.reclaim`). Your own ``teardown`` runs first."""
        if stage == "fit" and self._online is not None:
            # reached on every rank at a normal end only (a failed fit gets on_exception instead): safe to sync
            self._online.finish()
        self._give_back(fit=stage == "fit")

    @override
    def on_exception(self, exception: BaseException) -> None:
        """A fit that fails or is interrupted gets no ``teardown``: the same given back here."""
        self._give_back(fit=True)

    def _give_back(self, fit: bool) -> None:
        # a fit stopped mid-epoch (max_steps, should_stop) leaves its decode threads running past it
        for decoding in list(self._decoding):
            decoding.close()
        self.reclaim_sharing()
        if fit and self._online is not None:
            self._online.close()
        if fit:
            self._threads.restore()

    def reclaim_sharing(self) -> None:
        """Remove what its loaders' workers sent by file name and nobody received (only workers that have exited)."""
        for share in list(self._sharing):  # those still alive (a collected one reclaimed itself)
            share.reclaim()

    @classmethod
    def from_loaders(cls, train: DataLoader, val: DataLoader | None = None, **options: Any) -> TunedDataModule:
        """A TunedDataModule that builds your DataLoaders again from the arguments they were made with.

        What you set stays (the online loop starts from it); ``options`` are this class's arguments.

        Example::

            trainer.fit(model, datamodule=TunedDataModule.from_loaders(train_loader, autotune=OnlineTuning()))
        """
        if val is None:
            return _TrainLoaderModule(train, **options)
        return _TrainValLoaderModule(train, val, **options)

    @property
    def online_result(self) -> OnlineResult | None:
        """With ``autotune=OnlineTuning(...)``: what the loop measured on this run's steps and what it kept."""
        return self._online_off if self._online is None else self._online.result

    # ------------------------------------------------------------------ settings
    @property
    def hardware(self) -> Hardware:
        """The hardware probe (taken once)."""
        if self._hardware is None:
            self._hardware = probe_hardware(self.data_path, self._accelerator(), trainer_ranks(self.trainer))
        return self._hardware

    @property
    def loader_settings(self) -> LoaderSettings:
        """The policy's recommendation for this hardware (or the autotuned one)."""
        if self._settings is None:
            trainer = self._trainer_or_none()
            max_epochs = None if trainer is None else trainer.max_epochs
            self._settings = recommend_loader_settings(self.hardware, max_epochs=max_epochs)
        return self._settings

    def _accelerator(self) -> str | None:
        trainer = self._trainer_or_none()
        return None if trainer is None else trainer.strategy.root_device.type

    def _trainer_or_none(self) -> pl.Trainer | None:
        return getattr(self, "trainer", None)

    def _seed(self) -> int:
        return self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", "0"))

    def _ranks(self) -> tuple[int, int]:
        trainer = self._trainer_or_none()
        return (0, 1) if trainer is None else (trainer.global_rank, trainer.world_size)

    # ------------------------------------------------------------------ planning one DataLoader
    def plan_loader(self, stage: str, explicit: dict[str, Any]) -> tuple[LoaderPlan, dict[str, Any]]:
        check_loader_kwargs(explicit, self.hardware, self._accelerator())
        encoded = self.gpu_decode is not None and is_encoded_dataset(explicit.get("dataset"))
        if stage == "train" and isinstance(self.autotune, SearchTuning) and self.autotune_result is None:
            # the trials read the batches the way training will: encoded, through collate_encoded
            collate = {name: value for name, (value, _) in encoded_loader_defaults(explicit, None).items()}
            self._run_autotune({**explicit, **collate} if encoded else explicit)
        plan = LoaderPlan(stage, {key: value for key, value in explicit.items() if key != "dataset"})
        updates: dict[str, Any] = {}
        settings = self.loader_settings
        # CPU training: a batch timed here sets the workers, the loop's start on one rank (under DDP: the policy's)
        timed = self.autotune is None or (isinstance(self.autotune, OnlineTuning) and self._ranks()[1] == 1)
        if timed and "num_workers" not in explicit and not encoded and self._accelerator() == "cpu":
            settings = with_timed_workers(settings, explicit, self.hardware.cpus_per_rank)
        workers = explicit.get("num_workers", settings.num_workers)
        for name in POLICY_FIELDS:
            if name in explicit or (name in {"prefetch_factor", "persistent_workers"} and workers == 0):
                continue
            updates[name] = plan.chosen[name] = getattr(settings, name)
            plan.reasons[name] = settings.reasons.get(name, "")
        if (one := iterable_workers(explicit.get("dataset"), updates.get("num_workers", 0))) is not None:
            updates["num_workers"] = plan.chosen["num_workers"] = workers = 1
            plan.reasons["num_workers"] = one
        # the workers only read files: fewer than the policy's count, unless autotune measured it
        if encoded:
            measured = self.autotune_result is not None
            chosen = encoded_loader_defaults(explicit, None if measured else updates.get("num_workers"))
            for name, (value, reason) in chosen.items():
                updates[name] = value
                if reason:
                    plan.chosen[name], plan.reasons[name] = value, reason
            workers = updates.get("num_workers", workers)
        shared = SharedEpoch()
        updates.update(plan_sampler(stage, explicit, plan, shared, self._sharding(workers)))
        online = isinstance(self.autotune, OnlineTuning)
        if workers or online:  # the loop may start workers later
            user_init = explicit.get("worker_init_fn")
            updates["worker_init_fn"] = EpochSeededWorkerInit(
                self._seed(), self._ranks()[0], shared, user_init, batch_seeded=online
            )
            # autotune measures the training loader
            tuned = self.autotune_result if stage == "train" else None
            if tuned is not None and tuned.sharing_strategy is not None:  # the workers send the faster way
                updates = with_strategy(updates, tuned.sharing_strategy)
                self._sharing.add(updates["worker_init_fn"])  # its workers' unreceived batches: at teardown
                plan.notes.append(f"hand-over: {tuned.sharing_detail} (autotune), so the workers send that way")
        return plan, updates

    def _sharding(self, workers: int) -> Sharding:
        rank, world = self._ranks()
        trainer = self._trainer_or_none()
        position = None if trainer is None else functools.partial(resume_position, trainer)
        # the online loop may load in this process later: its copy of the dataset follows the epochs too
        loads_here = not workers or isinstance(self.autotune, OnlineTuning)
        return Sharding(rank, world, self._seed(), self.shard_drop_last, self.unpadded_eval, position, loads_here)

    def finish_loader(self, stage: str, loader: DataLoader, plan: LoaderPlan) -> None:
        """After construction: a training loader with our own sampler becomes resumable (Lightning's
        ``state_dict`` protocol) and, with ``num_workers=0``, fetches every batch seeded."""
        sampler = loader.sampler
        if stage == "train" and self._accelerator() == "cpu":
            online = isinstance(self.autotune, OnlineTuning)
            self._threads.apply(loader.num_workers, self.hardware.cpus_per_rank, plan, online)
        ours = type(sampler) is EpochAwareDistributedSampler
        if stage == "train" and isinstance(self.autotune, OnlineTuning) and not ours:
            self._online_off = online_off(loader, plan.notes)
        if stage != "train" or not ours or sampler.position is None:
            return
        make_resumable(loader, sampler)
        if loader.num_workers == 0:
            seed_batches_in_main_process(loader, self._seed(), self._ranks()[0], sampler.position)
            plan.notes.append(MAIN_PROCESS_SEEDING)
        trainer = self._trainer_or_none()
        if isinstance(self.autotune, OnlineTuning) and trainer is not None:
            seeding, options = (self._seed(), self._ranks()[0]), keywords(self.autotune)
            cpus, machine = self.hardware.cpus_per_rank, machine_words(self.hardware)
            split = self.gpu_decode.gpu_share if self.gpu_decode and is_encoded_dataset(loader.dataset) else None
            persistent = plan.explicit.get("persistent_workers", self.loader_settings.persistent_workers)
            self._online = attach_online(
                loader, trainer, cpus, plan.notes, seeding, options, machine, split, bool(persistent)
            )

    def decode_on_gpu(self, result: Any, plans: list[LoaderPlan]) -> Any:
        """``gpu_decode``: a hook's loader over encoded JPEGs comes back wrapped in a ``GpuDecodeLoader``."""
        if self.gpu_decode is None or not isinstance(result, DataLoader) or not is_encoded_dataset(result.dataset):
            return result
        trainer = self._trainer_or_none()
        device = trainer.strategy.root_device if trainer is not None else None
        shown = {"device": device} if device is not None else {}
        note = ", ".join(f"{key}={value}" for key, value in {**shown, **changed(self.gpu_decode)}.items())
        for plan in plans:
            plan.notes.append(f"GPU decode: wrapped in GpuDecodeLoader({note})")
        decoding = GpuDecodeLoader(result, device=device, **keywords(self.gpu_decode))
        self._decoding.add(decoding)
        if self._online is not None and self._online.current.gpu_share is not None:
            # the loop's share reaches the workers through it (a saved setting's share from the start)
            self._online.share_target = decoding.set_gpu_share
            decoding.set_gpu_share(self._online.current.gpu_share)
        return decoding

    def _run_autotune(self, explicit: dict[str, Any]) -> None:
        from lightning_dataperf.datamodule.tuning import search_for_datamodule

        self.autotune_result = search_for_datamodule(self, explicit)
        if self.autotune_result is not None:
            self._settings = self.autotune_result.settings

    # ------------------------------------------------------------------ reporting
    def report_plans(self, stage: str, plans: list[LoaderPlan]) -> None:
        self.loader_plans[stage] = plans
        if stage in self._reported or not plans:
            return
        self._reported.add(stage)
        publish_plans(self._trainer_or_none(), stage, plans, self.verbose)


class _TrainLoaderModule(TrainLoaders, TunedDataModule):
    """:meth:`TunedDataModule.from_loaders` with a training loader only."""


class _TrainValLoaderModule(TrainValLoaders, TunedDataModule):
    """:meth:`TunedDataModule.from_loaders` with a validation loader too."""
