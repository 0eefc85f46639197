"""Loader settings compared on three synthetic workloads: defaults, the article's tree, the policy, autotune.

For each workload an exhaustive grid over ``num_workers`` x ``prefetch_factor`` (x ``pin_memory`` on
CUDA) gives the best measured throughput; every named configuration is re-measured with the same
protocol (delivered batches/s after start-up, including the host-to-device copy on CUDA, median of
``--repeats`` runs, interleaved; rows naming the same configuration pool their runs). "of best" is
relative to the fastest of those re-measured configurations.

    python benchmarks/autotune.py                      # this machine, all workloads
    python benchmarks/autotune.py --workloads io --quick

Workloads: ``io`` (a 1 ms sleep per sample: I/O latency), ``cpu`` (decode-and-augment work on random
uint8 images: resize, crop, flip, blur, normalise), ``tiny`` (16-float samples, batch 512: per-batch
overhead dominates).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from typing import Any

import torch
from _common import print_table, write_json
from torch.nn import functional
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import article_settings, autotune_loader, probe_hardware, recommend_loader_settings
from lightning_dataperf.loaders import LoaderSettings


class SleepySamples(Dataset):
    """I/O-bound: each sample waits ``sleep_ms`` (like a network read) and costs no CPU."""

    def __init__(self, length: int = 100_000, sleep_ms: float = 1.0) -> None:
        self.length, self.sleep_ms = length, sleep_ms

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.sleep_ms / 1e3)
        return torch.full((3, 32, 32), float(index % 255))


class DecodedImages(Dataset):
    """CPU-bound: a uint8 'decoded' image, resized, cropped, flipped, blurred and normalised."""

    def __init__(self, length: int = 100_000, size: int = 160) -> None:
        self.length, self.size = length, size
        self.kernel = torch.full((3, 1, 3, 3), 1 / 9)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(index)
        image = torch.randint(0, 256, (1, 3, self.size, self.size), dtype=torch.uint8, generator=generator)
        image = functional.interpolate(image.float(), size=(192, 192), mode="bilinear", align_corners=False)
        top, left = (int(value) for value in torch.randint(0, 32, (2,), generator=generator))
        image = image[:, :, top : top + 160, left : left + 160]
        if index % 2:
            image = image.flip(-1)
        image = functional.conv2d(image, self.kernel, padding=1, groups=3)
        return ((image / 255.0 - 0.45) / 0.225).squeeze(0)


class TinySamples(Dataset):
    """Per-batch overhead: 16 floats per sample, large batches."""

    def __init__(self, length: int = 2_000_000) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((16,), float(index))


WORKLOADS = {
    "io": (SleepySamples, 32),
    "cpu": (DecodedImages, 32),
    "tiny": (TinySamples, 512),
}


def measure(
    dataset: Dataset, batch_size: int, workers: int, prefetch: int | None, pin: bool, seconds: float, device: Any
) -> float:
    """Batches per second after the first two (start-up), including the copy to ``device``."""
    options: dict[str, Any] = {"num_workers": workers, "pin_memory": pin}
    if workers:
        options["prefetch_factor"] = prefetch
    start_index = int(torch.randint(0, len(dataset) // 2, ()).item())
    subset = torch.utils.data.Subset(dataset, range(start_index, len(dataset)))
    iterator = iter(DataLoader(subset, batch_size=batch_size, **options))
    for _ in range(2):
        next(iterator)
    started, batches = time.perf_counter(), 0
    while batches < 3 or time.perf_counter() - started < seconds:
        batch = next(iterator)
        if device is not None:
            batch.to(device, non_blocking=True)
        batches += 1
    if device is not None:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    if callable(shutdown := getattr(iterator, "_shutdown_workers", None)):
        shutdown()
    return batches / elapsed


def median_rate(*args: Any, repeats: int) -> float:
    return statistics.median(measure(*args) for _ in range(repeats))


def _config(settings: LoaderSettings, cuda: bool) -> tuple[int, int | None, bool]:
    workers = settings.num_workers
    return workers, settings.prefetch_factor if workers else None, settings.pin_memory and cuda


def grid(cpus: int, cuda: bool, quick: bool) -> list[tuple[int, int | None, bool]]:
    workers = sorted({0, 1, 2, cpus // 2, cpus - 1, cpus, 2 * cpus} | ({4, 8, 12} if cpus >= 12 else set()))
    prefetches = (2, 8) if quick else (1, 2, 4, 8)
    pins = (False, True) if cuda else (False,)
    configs = []
    for count in workers:
        for pin in pins:
            configs.extend([(count, None, pin)] if count == 0 else [(count, value, pin) for value in prefetches])
    return configs


def run_workload(name: str, args: argparse.Namespace, device: Any) -> dict[str, Any]:
    factory, batch_size = WORKLOADS[name]
    dataset = factory()
    hardware = probe_hardware()
    cpus = hardware.cpus_per_rank
    cuda = device is not None
    rates: dict[tuple[int, int | None, bool], float] = {}
    for config in grid(cpus, cuda, args.quick):
        rates[config] = median_rate(dataset, batch_size, *config, args.seconds, device, repeats=args.grid_repeats)
    best_config = max(rates, key=rates.get)
    named: dict[str, LoaderSettings] = {
        "defaults (num_workers=0)": LoaderSettings(0, False, False, None),
        "article tree": article_settings(os.cpu_count() or 1, batch_size, epochs=10),
        "policy": recommend_loader_settings(hardware, accelerator="cuda" if cuda else "cpu"),
    }
    started = time.perf_counter()
    tuned = autotune_loader(
        dataset,
        batch_size,
        hardware=hardware,
        device=device,
        time_budget=args.budget,
        force=True,
        cache_path=os.path.join(args.cache_dir, "autotune_bench.json"),
    )
    search_s = time.perf_counter() - started
    named["autotune"] = tuned.settings
    # Re-measure every named configuration and the grid's best together, interleaved, so drift on a busy
    # machine hits them alike.
    named_configs = {label: _config(settings, cuda) for label, settings in named.items()}
    named_configs["grid best"] = best_config
    samples: dict[str, list[float]] = {label: [] for label in named_configs}
    for _ in range(args.repeats):
        for label, config in named_configs.items():
            samples[label].append(measure(dataset, batch_size, *config, args.seconds, device))
    # Rows that name the same configuration are one configuration: pool their measurements.
    pooled: dict[tuple[int, int | None, bool], list[float]] = {}
    for label, config in named_configs.items():
        pooled.setdefault(config, []).extend(samples[label])
    final = {label: statistics.median(pooled[config]) for label, config in named_configs.items()}
    reference = max(final.values())  # the grid's winner re-measured can fall back (winner's curse)
    rows, results = [], {}
    for label, config in named_configs.items():
        share = final[label] / reference
        results[label] = {"config": config, "batches_per_sec": final[label], "of_best": share}
        rows.append([name, label, *config, f"{final[label]:.1f}", f"{100 * share:.0f}%"])
    return {
        "rows": rows,
        "results": results,
        "grid": {str(config): rate for config, rate in rates.items()},
        "grid_best": {"config": best_config, "batches_per_sec_in_grid": rates[best_config]},
        "final_samples": {label: values for label, values in samples.items()},
        "autotune_search_s": search_s,
        "autotune_trials": len(tuned.trials),
        "cpus_per_rank": cpus,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=0.6, help="timed seconds per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each named configuration")
    parser.add_argument("--grid-repeats", type=int, default=None, help="runs per grid point (default: --repeats)")
    parser.add_argument("--budget", type=float, default=30.0, help="autotune time budget (s)")
    parser.add_argument("--quick", action="store_true", help="fewer prefetch values in the grid")
    parser.add_argument("--cache-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--cpu", action="store_true", help="do not copy to the GPU even if there is one")
    args = parser.parse_args()
    args.grid_repeats = args.grid_repeats or args.repeats
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.cpu else None
    payload: dict[str, Any] = {"args": vars(args), "workloads": {}}
    rows = []
    for name in args.workloads:
        result = run_workload(name, args, device)
        payload["workloads"][name] = result
        rows.extend(result["rows"])
        print(f"{name}: autotune searched {result['autotune_search_s']:.1f} s over {result['autotune_trials']} trials")
    table = print_table(["workload", "settings", "workers", "prefetch", "pin", "batches/s", "of best"], rows)
    payload["table"] = table
    suffix = "cuda" if device is not None else "cpu"
    path = write_json(f"autotune_{suffix}", payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
