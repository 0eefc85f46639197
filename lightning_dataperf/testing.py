"""Ground-truth workloads for checking timing accuracy on a GPU, and a two-rank launch on the loopback.

Example::

    cycles = calibrate_cuda_sleep()
    model = GpuSleepModel(gpu_ms=15.0, cycles_per_ms=cycles)   # each step keeps the GPU busy 15 ms
    command, env = loopback_ranks("check_ranks.py", "--out", "/tmp/ranks")
    subprocess.run(command, env=env, check=True)
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
import uuid

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf._lightning_hooks import cuda_sleep

__all__ = [
    "GpuSleepModel",
    "SleepCollate",
    "SleepingLoaderDataset",
    "calibrate_cuda_sleep",
    "loopback_ranks",
    "sleeping_loader",
]


def loopback_ranks(
    script: str, *args: str, ranks: int = 2, pythonpath: str = "", log_dir: str = os.devnull
) -> tuple[list[str], dict[str, str]]:
    """The ``torch.distributed.run`` command and environment that start ``script`` as ``ranks`` ranks on this
    host's loopback only.

    The ranks meet at ``127.0.0.1`` (not ``--standalone``'s ``localhost``, which a host may resolve to IPv6
    first), the agent's store takes a free port itself (no port to race for), and gloo talks over the loopback
    interface (no host name to resolve). ``pythonpath`` goes before the inherited ``PYTHONPATH``. The inherited
    ``CUDA_VISIBLE_DEVICES`` is removed: on a GPU host each rank sees every device and picks its own by
    ``LOCAL_RANK`` (NCCL ranks); a script that trains on the CPU uses gloo and no device. ``log_dir`` is the
    launcher's ``--log-dir``: ``os.devnull`` (the default) keeps no per-rank log files (the ranks print to this
    process's streams; without it the launcher leaves a ``torchelastic_*`` folder in the temporary folder).
    """
    paths = [path for path in (pythonpath, os.environ.get("PYTHONPATH", "")) if path]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    # Each rank picks its own device by LOCAL_RANK, so it must see them all.
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if "lo" in {name for _, name in socket.if_nameindex()}:
        # No host name to resolve: gloo talks over the loopback interface.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={ranks}",
        "--rdzv-backend=c10d",
        # Port 0: the agent's store takes a free port itself, so there is no port to race for.
        "--rdzv-endpoint=127.0.0.1:0",
        f"--rdzv-id={uuid.uuid4().hex}",
        "--local-addr=127.0.0.1",
        f"--log-dir={log_dir}",  # the agent's per-rank log folders; os.devnull: none (not a torchelastic_* in TMPDIR)
        script,
        *args,
    ]
    return command, env


def calibrate_cuda_sleep(probe_ms_cycles: int = 50_000_000, repeats: int = 5) -> float:
    """Cycles of ``torch.cuda._sleep`` per millisecond, measured with CUDA events."""
    # A first call loads the kernel: left out of the timed repeats.
    cuda_sleep(1_000_000)
    rates = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        cuda_sleep(probe_ms_cycles)
        end.record()
        end.synchronize()
        rates.append(probe_ms_cycles / start.elapsed_time(end))
    # The median ignores a repeat disturbed by other work on the GPU.
    return statistics.median(rates)


class SleepingLoaderDataset(Dataset):
    """Tiny samples; the cost lives in the collate function (a known host sleep per batch)."""

    def __init__(self, length: int, features: int = 16) -> None:
        self.length, self.features = length, features

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.features,), float(index))


class SleepCollate:
    """Stacks samples after a known host sleep of ``sleep_ms`` per batch."""

    def __init__(self, sleep_ms: float) -> None:
        self.sleep_ms = sleep_ms

    def __call__(self, samples: list[torch.Tensor]) -> torch.Tensor:
        time.sleep(self.sleep_ms / 1e3)
        return torch.stack(samples)


def sleeping_loader(batches: int, loader_ms: float, batch_size: int = 8, **kwargs) -> DataLoader:
    """A loader whose every batch costs ``loader_ms`` of host time."""
    dataset = SleepingLoaderDataset(batches * batch_size)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=SleepCollate(loader_ms), **kwargs)


class GpuSleepModel(pl.LightningModule):
    """Each training step keeps the GPU busy for ``gpu_ms`` (``torch.cuda._sleep``) plus a tiny layer."""

    def __init__(self, gpu_ms: float, cycles_per_ms: float, features: int = 16) -> None:
        super().__init__()
        self.cycles = int(gpu_ms * cycles_per_ms)
        # Something to train: automatic optimisation needs a loss that requires grad.
        self.layer = nn.Linear(features, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        # A known device time per step: the ground truth the timings are checked against.
        cuda_sleep(self.cycles)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)
