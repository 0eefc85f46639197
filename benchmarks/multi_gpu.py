"""Per-rank figures on a multi-GPU host: loader throughput under the per-rank CPU budget, and side-stream
copies under DDP (NCCL), each rank's step time as a ratio to its ideal.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD torchrun --standalone --nproc_per_node=2 benchmarks/multi_gpu.py

Loader: every rank at once builds the CPU-bound ``cpu`` workload of ``autotune.py`` with the policy's
settings for this rank (the host's usable cores divided by the local ranks), and, for contrast, with the
whole host's count per rank (what a per-host rule such as the article's gives every rank), and measures
delivered batches/s including the pinned copy to its GPU. Transfer: each rank trains on ready 128 MB
batches with a GPU step of 1x the copy time (``torch.cuda._sleep``): data already on the GPU (ideal),
stock DDP with pinned batches, and ``SideStreamDDPStrategy``; ratio = median step / max(resident step,
copy time), per rank. Rank zero prints the tables and writes ``multi_gpu.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics

import _common
import torch
import torch.distributed as dist
from autotune import DecodedImages, measure
from lightning.pytorch.strategies import DDPStrategy
from transfer import MB, pinned_bandwidth, step_time

from lightning_dataperf import SideStreamDDPStrategy, probe_hardware, recommend_loader_settings
from lightning_dataperf.testing import calibrate_cuda_sleep


def loader_rates(device: torch.device, seconds: float) -> dict:
    hardware = probe_hardware()
    policy = recommend_loader_settings(hardware, accelerator="cuda")
    whole_host = max(1, hardware.usable_cpus - 1)
    rates = {}
    for label, workers in (("policy (per-rank budget)", policy.num_workers), ("whole host per rank", whole_host)):
        dist.barrier()  # every rank loads at the same time, as in training
        rate = measure(DecodedImages(), 32, workers, policy.prefetch_factor or 2, True, seconds, device)
        rates[label] = {"workers": workers, "batches_per_sec": rate}
    return {"cpus_per_rank": hardware.cpus_per_rank, "usable_cpus": hardware.usable_cpus, "rates": rates}


def transfer_ratios(device: torch.device, size_mb: int, steps: int, repeats: int) -> dict:
    cycles_per_ms = calibrate_cuda_sleep()
    bandwidth = pinned_bandwidth(size_mb * MB)
    copy_s = size_mb * MB / bandwidth
    cycles = int(copy_s * 1e3 * cycles_per_ms)
    pinned = torch.randn(size_mb * MB // 4).pin_memory()
    resident = pinned.to(device)
    devices = int(os.environ["LOCAL_WORLD_SIZE"])
    runs: dict[str, list[float]] = {"resident": [], "stock_pinned": [], "side_stream": []}
    for _ in range(repeats):
        runs["resident"].append(step_time(resident, cycles, DDPStrategy(), steps, devices))
        runs["stock_pinned"].append(step_time(pinned, cycles, DDPStrategy(), steps, devices))
        runs["side_stream"].append(step_time(pinned, cycles, SideStreamDDPStrategy(lookahead=1), steps, devices))
    ideal = max(statistics.median(runs["resident"]), copy_s)
    return {
        "pinned_GBps": bandwidth / 1e9,
        "copy_ms": copy_s * 1e3,
        "ideal_ms": ideal * 1e3,
        "runs_s": runs,
        "ratio": {name: statistics.median(values) / ideal for name, values in runs.items() if name != "resident"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per loader measurement")
    parser.add_argument("--size-mb", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    record = {
        "rank": dist.get_rank(),
        "gpu": torch.cuda.get_device_name(device),
        "loader": loader_rates(device, args.seconds),
        "transfer": transfer_ratios(device, args.size_mb, args.steps, args.repeats),
    }
    records: list = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    if dist.get_rank() == 0:
        report(records, args)
    dist.barrier()
    dist.destroy_process_group()


def report(records: list[dict], args: argparse.Namespace) -> None:
    loader_rows = [
        [r["rank"], r["loader"]["usable_cpus"], r["loader"]["cpus_per_rank"], label, v["workers"], v["batches_per_sec"]]
        for r in records
        for label, v in r["loader"]["rates"].items()
    ]
    loader_table = _common.print_table(
        ["rank", "usable CPUs", "CPUs per rank", "workers from", "workers", "batches/s"], loader_rows
    )
    transfer_rows = []
    for r in records:
        t = r["transfer"]
        transfer_rows.append(
            [
                r["rank"],
                t["pinned_GBps"],
                t["copy_ms"],
                t["ideal_ms"],
                1e3 * statistics.median(t["runs_s"]["stock_pinned"]),
                1e3 * statistics.median(t["runs_s"]["side_stream"]),
                t["ratio"]["stock_pinned"],
                t["ratio"]["side_stream"],
            ]
        )
    transfer_table = _common.print_table(
        ["rank", "pinned GB/s", "copy ms", "ideal ms", "stock pinned ms", "side ms", "stock/ideal", "side/ideal"],
        transfer_rows,
    )
    _common.write_json(
        "multi_gpu",
        {"args": vars(args), "ranks": records, "loader_table": loader_table, "transfer_table": transfer_table},
    )


if __name__ == "__main__":
    main()
