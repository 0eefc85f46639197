"""Run under ``torch.distributed.run --nproc_per_node=2``: the online loop on two gloo ranks.

Usage: ddp_online_script.py OUT_DIR MODE [ROOT] [CKPT]. MODE: ``untuned`` (no loop, no workers), ``online`` (the
loop, a checkpoint at step 20), ``resume`` (the loop, from CKPT), ``saving`` (a search that ends early: its setting
saved), ``again`` (the loop where a setting was saved), ``changed`` (another batch size, rank one slow to load,
``limit_train_batches`` and a stop by ``max_steps`` mid-trial), ``fail0`` or ``fail1`` (that rank raises in its
first switch). ROOT: the trainer's ``default_root_dir`` (where the kept setting is saved).
"""

import json
import os
import sys
import time

import lightning.pytorch as pl
import psutil
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers
from helpers import IndexData, IndexedDataset, RecordingModel, ddp_kwargs
from torch.utils.data import DataLoader

from lightning_dataperf import OnlineTuning
from lightning_dataperf.datamodule import online

#: every trial ends at its first 8 counted batches, so the loop decides whatever the machine's speed
QUICK = {"precision": 10.0, "max_batches": 8, "max_cost": 10.0, "min_seconds": 0.0}
#: a search soon over its cost cap: it ends, and its setting is saved, within a run of any speed
CAPPED = {**QUICK, "max_cost": 1e-6}
LENGTH, SEED, EPOCHS = 240, 5, 3


class Processes(Callback):
    """Writes this rank's process and its loader workers' ids at step 5 (the test checks none outlives a failure)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 5:
            me = psutil.Process()
            pids = [me.pid] + [child.pid for child in me.children(recursive=True)]
            with open(self.path, "w", encoding="utf-8") as handle:
                json.dump(pids, handle)


class SlowOnRankOne(IndexedDataset):
    """Rank one's samples take 4 ms each to load: that rank waits for its data, rank zero does not."""

    def __getitem__(self, index):
        if os.environ["RANK"] == "1":
            time.sleep(0.004)
        return super().__getitem__(index)


class Straggling(IndexData):
    def train_dataloader(self):
        return DataLoader(SlowOnRankOne(self.length), batch_size=self.batch_size, shuffle=True, num_workers=1)


def record_switches(rank: int, mode: str) -> list:
    """Each switch as (batches fetched on this rank, the setting): patched into the iterator's switch."""
    switches = []
    switch = online.OnlineIterator._switch

    def recording(self, setting):
        switches.append([self.tuner.sync.batches, setting.describe()])
        if mode == f"fail{rank}":
            raise RuntimeError(f"rank {rank} failed mid-switch")
        return switch(self, setting)

    online.OnlineIterator._switch = recording
    return switches


def main(out_dir: str, mode: str, root: str = "", ckpt: str = "") -> None:
    rank = int(os.environ["RANK"])
    switches = record_switches(rank, mode)
    tuning = {} if mode == "untuned" else {"autotune": OnlineTuning(**(CAPPED if mode == "saving" else QUICK))}
    batch_size = 6 if mode == "changed" else 4
    # the untuned run in the training process: each batch's draws keyed by its number, as the loop's are
    workers = 0 if mode == "untuned" else 1
    # the changed loader: another batch size, and a dataset that makes rank one a straggler
    module = Straggling if mode == "changed" else IndexData
    datamodule = module(length=LENGTH, batch_size=batch_size, workers=workers, seed=SEED, verbose=False, **tuning)
    model = RecordingModel()
    callbacks = [Processes(os.path.join(out_dir, f"{mode}_pids{rank}.json"))]
    if mode == "online":
        callbacks.append(ModelCheckpoint(os.path.join(out_dir, "ckpt"), every_n_train_steps=20, save_top_k=-1))
    limits = {"limit_train_batches": 10, "max_steps": 25} if mode == "changed" else {}
    options = ddp_kwargs(root or out_dir, enable_checkpointing=mode == "online", **limits)
    trainer = pl.Trainer(max_epochs=2 if mode == "saving" else EPOCHS, callbacks=callbacks, logger=False, **options)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt or None)
    result = datamodule.online_result
    (plan,) = datamodule.loader_plans["train"]
    record = {
        "rows": model.rows,
        "switches": switches,
        "notes": plan.notes,
        "start": None if result is None or result.start is None else result.start.setting.describe(),
        "kept": None if result is None or result.kept is None else result.kept.setting.describe(),
        "trials": 0 if result is None else len(result.trials),
        "tried": [] if result is None else sorted({trial.setting.describe() for trial in result.trials}),
        "summary": None if result is None else result.summary(),
        "waits": [] if result is None else [waits.batches for waits in getattr(result, "waits", [])],
    }
    with open(os.path.join(out_dir, f"{mode}_rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    # gloo's threads joined now: left to interpreter teardown, rank zero aborted at exit in about one full suite in
    # three on 2 cores ("terminate called without an active exception"), after its record was written
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
