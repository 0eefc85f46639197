"""Run under ``torch.distributed.run --nproc_per_node=2``: record which samples each rank saw.

Usage: ddp_sampling_script.py OUT_DIR MODE [CKPT]. MODE: ``pad`` (drop_last=False, Lightning's padded
evaluation), ``rerun`` (``pad`` again, without checkpoints), ``drop`` (shard_drop_last=True, unpadded
evaluation), ``resume`` (pad, from CKPT) or ``autotune`` (rank zero searches, every rank receives it).
"""

import json
import os
import sys

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers
from helpers import IndexData, RecordingModel, ddp_kwargs

TRAIN_LENGTH, VAL_LENGTH = 31, 11  # not divisible by 2 ranks


def main(out_dir: str, mode: str, ckpt: str | None = None) -> None:
    rank = int(os.environ["RANK"])
    if mode == "autotune":
        return autotune(out_dir, rank)
    datamodule = IndexData(
        length=TRAIN_LENGTH,
        val_length=VAL_LENGTH,
        workers=1,
        seed=21,
        shard_drop_last=mode == "drop",  # rerun and resume are "pad" runs
        unpadded_eval=mode == "drop",
        verbose=False,
    )
    model = RecordingModel()
    checkpointing = mode in ("pad", "drop")
    callbacks = (
        [ModelCheckpoint(os.path.join(out_dir, "ckpt"), every_n_train_steps=1, save_top_k=-1)] if checkpointing else []
    )
    options = ddp_kwargs(out_dir, enable_checkpointing=checkpointing)
    trainer = pl.Trainer(max_epochs=3, callbacks=callbacks, logger=False, **options)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt)
    (plan,) = datamodule.loader_plans["train"]
    (val_plan,) = datamodule.loader_plans["val"]
    record = {
        "rows": model.rows,
        "val_indices": model.val_indices,
        "padded": plan.padded_samples,
        "dropped": plan.dropped_samples,
        "val_padded": val_plan.padded_samples,
        "val_avoided": val_plan.padded_samples_avoided,
    }
    with open(os.path.join(out_dir, f"{mode}_rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)


def autotune(out_dir: str, rank: int) -> None:
    import lightning_dataperf.autotune.tune as module
    from lightning_dataperf import SearchTuning

    searches = []
    search = module.autotune_loader

    def counting(*args, **kwargs):
        searches.append(1)
        return search(*args, **kwargs)

    module.autotune_loader = counting
    os.environ["LIGHTNING_DATAPERF_CACHE"] = os.path.join(out_dir, "cache.json")
    datamodule = IndexData(length=64, seed=3, autotune=SearchTuning(time_budget=2.0, batch_budget=10), verbose=False)
    trainer = pl.Trainer(max_epochs=1, logger=False, **ddp_kwargs(out_dir))
    trainer.fit(RecordingModel(), datamodule=datamodule)
    (plan,) = datamodule.loader_plans["train"]
    record = {"searches": len(searches), "autotune": datamodule.autotune_result.to_dict(), "chosen": plan.chosen}
    with open(os.path.join(out_dir, f"autotune_rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:])
