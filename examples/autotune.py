"""Autotuning without Lightning: find fast DataLoader settings for a dataset, then use them.

    python examples/autotune.py --budget 10

The dataset waits 2 ms per sample (I/O-like), so the best worker count is well above the CPU count;
the search starts from the hardware policy and hill-climbs within the time budget, then the result is
cached in dataperf_logs/autotune_example.json (run it twice: the second run is instant; --force searches again).
"""

from __future__ import annotations

import argparse

from _synthetic import SyntheticImages
from torch.utils.data import DataLoader

from lightning_dataperf import AutotuneResult, autotune_loader


def main(argv: list[str] | None = None) -> AutotuneResult:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=10.0, help="search time budget (s)")
    parser.add_argument("--sleep-ms", type=float, default=2.0)
    parser.add_argument("--cache", default="dataperf_logs/autotune_example.json", help="the result's cache file")
    parser.add_argument("--force", action="store_true", help="ignore the cache")
    args = parser.parse_args(argv)
    dataset = SyntheticImages(length=20_000, sleep_ms=args.sleep_ms)
    result = autotune_loader(dataset, batch_size=32, time_budget=args.budget, cache_path=args.cache, force=args.force)
    print(result.format())
    loader = DataLoader(dataset, batch_size=32, shuffle=True, **result.settings.as_kwargs())
    print(f"DataLoader(num_workers={loader.num_workers}, prefetch_factor={loader.prefetch_factor}, ...)")
    return result


if __name__ == "__main__":
    main()
