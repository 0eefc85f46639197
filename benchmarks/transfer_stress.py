"""Correctness stress test of side-stream copies: random shapes, dtypes and nesting.

Every batch carries host-side checksums computed before transfer; the step recomputes them on the
device and counts mismatches (on the GPU, no host sync). Every 50th batch is also compared
bit-for-bit with a synchronous copy of the same batch regenerated on the host. Device memory and
pinned host memory are sampled to show they stay flat.

    python benchmarks/transfer_stress.py --batches 10000
"""

from __future__ import annotations

import argparse

import _common
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import SideStreamStrategy
from lightning_dataperf.batches import map_tensors

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.float64]


def make_batch(index: int) -> dict:
    generator = torch.Generator().manual_seed(index)

    def tensor() -> torch.Tensor:
        dtype = DTYPES[int(torch.randint(len(DTYPES), (1,), generator=generator))]
        shape = tuple(
            int(s)
            for s in torch.randint(1, 64, (int(torch.randint(1, 4, (1,), generator=generator)),), generator=generator)
        )
        if dtype.is_floating_point:
            return torch.randn(shape, generator=generator).to(dtype)
        return torch.randint(0, 120, shape, generator=generator).to(dtype)

    nested = {
        "a": tensor(),
        "list": [tensor() for _ in range(int(torch.randint(1, 4, (1,), generator=generator)))],
        "tuple": (tensor(), {"deep": tensor()}),
        "index": torch.tensor(index),
    }
    if index % 3 == 0:
        nested["big"] = torch.randn(256, 1024, generator=generator)  # 1 MB
    return nested


def checksum(value: torch.Tensor) -> torch.Tensor:
    """Exact, order-independent checksum of the bytes: sum of byte * (position mod 251 + 1) in int64."""
    raw = value.contiguous().view(-1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(raw.numel(), device=raw.device, dtype=torch.int64) % 251 + 1
    return (raw * weights).sum()


class StressData(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        batch = make_batch(index)
        sums: list[torch.Tensor] = []
        map_tensors(batch, lambda t: sums.append(checksum(t)) or t)
        batch["checksums"] = torch.stack(sums)
        return batch


class StressModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.mismatches = None
        self.bitwise_checked = 0
        self.bitwise_failures = 0
        self.memory: list[tuple[int, int, int]] = []

    def training_step(self, batch, batch_idx):
        checksums = batch.pop("checksums")
        sums: list[torch.Tensor] = []
        map_tensors(batch, lambda t: sums.append(checksum(t)) or t)
        bad = (torch.stack(sums) != checksums).sum()
        self.mismatches = bad if self.mismatches is None else self.mismatches + bad
        torch.cuda._sleep(20_000)  # a little GPU work so that copies overlap compute
        if batch_idx % 50 == 0:
            reference = make_batch(int(batch["index"].item()))
            pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
            flat_device: list[torch.Tensor] = []
            map_tensors(batch, lambda t: flat_device.append(t) or t)
            map_tensors(reference, lambda t: pairs.append((t.to(self.device), flat_device[len(pairs)])) or t)
            self.bitwise_checked += 1
            self.bitwise_failures += sum(not torch.equal(a, b) for a, b in pairs)
        if batch_idx % 1000 == 0:
            host = (
                torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
                if hasattr(torch.cuda, "host_memory_stats")
                else -1
            )
            self.memory.append((batch_idx, torch.cuda.memory_allocated(), host))
        return (self.weight * 0).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--lookahead", type=int, default=2)
    parser.add_argument("--min-bytes", type=int, default=0, help="0: every batch through the side stream")
    args = parser.parse_args()
    model = StressModel()
    loader = DataLoader(StressData(args.batches), batch_size=None, num_workers=4, pin_memory=True)
    strategy = SideStreamStrategy(lookahead=args.lookahead, min_bytes=args.min_bytes)
    _common.fit_quietly(model, loader, accelerator="cuda", strategy=strategy, logger=False)
    mismatches = int(model.mismatches.item())
    rows = [[args.batches, args.lookahead, mismatches, model.bitwise_checked, model.bitwise_failures]]
    _common.print_table(["batches", "lookahead", "checksum mismatches", "bitwise checks", "bitwise failures"], rows)
    _common.print_table(["batch", "device bytes allocated", "pinned host bytes allocated"], model.memory)
    _common.write_json(
        "transfer_stress",
        {
            "batches": args.batches,
            "lookahead": args.lookahead,
            "checksum_mismatches": mismatches,
            "bitwise_checked": model.bitwise_checked,
            "bitwise_failures": model.bitwise_failures,
            "memory": model.memory,
        },
    )


if __name__ == "__main__":
    main()
