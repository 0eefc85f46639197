"""One rank of the two-process side-stream DDP test: both ranks share the one GPU (gloo backend).

Each process poses as its own node (``LOCAL_RANK=0``, ``GROUP_RANK=RANK``) so that both use ``cuda:0``;
NCCL refuses two ranks on one GPU, gloo does not. Writes ``rank<N>.json`` with what the rank saw.
"""

import dataclasses
import json
import os
import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for helpers
from helpers import Checksummed, ChecksumModel, trainer_kwargs

from lightning_dataperf import DataPerfCallback, SideStreamDDPStrategy


class CopierRecord(pl.Callback):
    """What the strategy's copier did, read before teardown drops it."""

    def on_train_end(self, trainer, pl_module):
        copier = trainer.strategy.copier
        self.side_copies = copier._side_copies
        self.stream_is_default = copier.stream == torch.cuda.default_stream(trainer.strategy.root_device)


def main(out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    os.environ["LOCAL_RANK"], os.environ["GROUP_RANK"] = "0", str(rank)
    model = ChecksumModel()
    perf = DataPerfCallback(print_summary=False, write_json=False)
    strategy = SideStreamDDPStrategy(lookahead=2, min_bytes=0, process_group_backend="gloo")
    options = trainer_kwargs(out_dir, accelerator="cuda", devices=1, num_nodes=2, strategy=strategy)
    copier = CopierRecord()
    trainer = pl.Trainer(max_epochs=2, callbacks=[perf, copier], logger=False, **options)
    trainer.fit(model, DataLoader(Checksummed(), batch_size=8, pin_memory=True))
    record = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "device": str(strategy.root_device),
        "side_stream_active": strategy.side_stream_active,
        "side_copies": copier.side_copies,
        "stream_is_default": copier.stream_is_default,
        "mismatches": int(torch.stack(model.mismatches).sum()),
        "indices": [int(index) for batch in model.seen for index in batch],
        "copies": dataclasses.asdict(perf.summaries[-1].copies),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main(*sys.argv[1:])
