"""Run under ``torch.distributed.run --nproc_per_node=2``: rank 1's loader is slower on purpose."""

import json
import os
import sys

import lightning.pytorch as pl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers

from helpers import SleepyModel, ddp_kwargs, sleepy_loader

from lightning_dataperf import DataPerfCallback


def main(out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    loader_s = 0.040 if rank == 1 else 0.002
    perf = DataPerfCallback(print_summary=False)
    options = ddp_kwargs(out_dir, use_distributed_sampler=True)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], **options)
    trainer.fit(SleepyModel(step_s=0.005), sleepy_loader(2 * 12 * 4, 4, loader_s))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(perf.summaries[-1].to_dict(), handle)
    with open(os.path.join(out_dir, f"rank{rank}_verdict.json"), "w", encoding="utf-8") as handle:
        json.dump(perf.diagnoses[-1].to_dict(), handle, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
