"""Run under ``torch.distributed.run --nproc_per_node=2``: rank 1's loader is slower on purpose."""

import json
import os
import sys

import lightning.pytorch as pl

sys.path.insert(0, os.path.dirname(__file__))
from helpers import SleepyModel, sleepy_loader

from lightning_dataperf import DataPerfCallback


def main(out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    loader_s = 0.040 if rank == 1 else 0.002
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        callbacks=[perf],
        default_root_dir=out_dir,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        use_distributed_sampler=True,
    )
    trainer.fit(SleepyModel(step_s=0.005), sleepy_loader(2 * 12 * 4, 4, loader_s))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(perf.summaries[-1].to_dict(), handle)


if __name__ == "__main__":
    main(sys.argv[1])
