"""Autotune's pick against a grid measured in the same run, the policy's pick, and search time against grid time.

Every measurement runs the batches through the workload's training path (the same
:class:`~lightning_dataperf.autotune.consumer.TransferPath` autotune is given): the copy (stock
``non_blocking`` or the side stream), the device transform, and the step.

**The grid**: the full cross-product ``num_workers`` x ``prefetch_factor`` x ``pin_memory`` a user
would run (:func:`grid`): workers from (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32) up to ``max(8, 2 x CPUs)``
for a loader that computes and on to 48 and 64 for the I/O-latency one (``--grid-workers`` to choose them),
prefetch (2, 4, 8) (``--grid-prefetch``), pin both ways on a CUDA path, the side stream's too (autotune
searches it pinned only, where the side stream need not pin in the main thread; a user's grid does not
know that: each point's seconds are in the JSON, so the pinned half's cost is there too), and left out on a
CPU-only run (nothing is copied; the script says so); with
``--grid-sharing default file_system`` each point also with its workers sending by file name (the
hand-over autotune measures where its climb stops).

**Grid time, defined**: what a user would pay for that grid at the SAME accuracy as autotune's trials.
Each grid point is one trial by autotune's own rule (:meth:`TrialRunner.run`: fresh workers, start-up
and the batches queued during it excluded from the rate, stopped once the rate's relative standard
error is below ``--precision`` over at least three rounds, or at the same per-trial cap and batch cap);
grid time is the wall time of those trials. Search time is autotune's ``search_seconds`` (probe,
trials, repeats, bookkeeping).

**The pick, measured fairly**: after the search, the policy's pick, autotune's pick and the grid's
``--grid-top`` fastest points are measured again ``--repeats`` times, interleaved (order reversed every
other repeat), fresh workers each time, on the same consumer, with twice the per-trial cap; the grid best
is the one of those points fastest on re-measurement (not the largest single grid measurement: that is
biased upwards, the winner's curse). Then autotune's pick and the grid best are measured head to head, in
interleaved pairs with four times the cap, until the ratio's standard error is below ``--resolve`` or
``--max-pairs`` (or ``--deadline``) are spent. "of grid best" is the geometric mean of the within-repeat
ratios (row's rate / grid best's rate) with twice its standard error, "spread" their least and most.
Where two rows name the same configuration they share its measurements (ratio 100%). Grid and search run
with :func:`~lightning_dataperf.autotune.measures.gc_frozen` alike.

    python benchmarks/autotune.py                          # every workload this machine can run
    python benchmarks/autotune.py --workloads io tiny cpu --cpu --repeats 3
    python benchmarks/autotune.py --workloads jpeg --paths side_stream     # one path of the H200 row

Workloads:

* ``jpeg`` (CUDA + torchvision): 320-px JPEGs generated in memory, PIL decode, RandomResizedCrop 224 +
  flip to uint8, on the GPU float + normalise (``device_transform``), a ResNet-18 bf16 training step
  (channels-last, SGD) as the consumer; batch 128; paths ``stock`` and ``side_stream``;
* ``cpu``: CPU-heavy transform (resize, crop, flip, 3x3 blur, normalise of a 160-px image), batch 32;
* ``io``: I/O latency, a 5 ms sleep per sample, batch 16, no CPU;
* ``tiny``: 16 floats per sample, batch 64, 2 ms of main-thread host work per step (a busy-wait).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import time
import warnings
from typing import Any

import torch
from _common import print_table, write_json
from torch.nn import functional
from torch.utils.data import Dataset

from lightning_dataperf import autotune_loader, probe_hardware, recommend_loader_settings
from lightning_dataperf.autotune.consumer import TransferPath
from lightning_dataperf.autotune.measures import gc_frozen
from lightning_dataperf.autotune.runner import TrialRunner
from lightning_dataperf.autotune.trial import Limits
from lightning_dataperf.loader.sharing import FAST_HANDOVER

Config = tuple[int, int | None, bool]


class SleepySamples(Dataset):
    """I/O-bound: each sample waits ``sleep_ms`` (like a network read) and costs no CPU."""

    def __init__(self, length: int = 200_000, sleep_ms: float = 5.0) -> None:
        self.length, self.sleep_ms = length, sleep_ms

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.sleep_ms / 1e3)
        return torch.full((3, 32, 32), float(index % 255))


class DecodedImages(Dataset):
    """CPU-bound: a uint8 'decoded' image, resized, cropped, flipped, blurred and normalised."""

    def __init__(self, length: int = 200_000, size: int = 160) -> None:
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
    def __init__(self, length: int = 4_000_000) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((16,), float(index))


class JpegImages(Dataset):
    """PIL decode of in-memory JPEGs + RandomResizedCrop(224) + flip, to a uint8 CHW tensor and a label."""

    def __init__(self, count: int = 512, length: int = 200_000, size: int = 320) -> None:
        from PIL import Image
        from torchvision import transforms

        generator = torch.Generator().manual_seed(0)
        self.blobs = []
        for _ in range(count):
            base = torch.randint(0, 256, (3, size // 8, size // 8), dtype=torch.uint8, generator=generator)
            image = functional.interpolate(base[None].float(), size=(size, size), mode="bilinear")[0]
            image = (image + torch.randn(image.shape, generator=generator) * 12).clamp(0, 255).byte()
            buffer = io.BytesIO()
            Image.fromarray(image.permute(1, 2, 0).numpy()).save(buffer, format="JPEG", quality=90)
            self.blobs.append(buffer.getvalue())
        self.length = length
        self.transform = transforms.Compose(
            [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        image = Image.open(io.BytesIO(self.blobs[index % len(self.blobs)])).convert("RGB")
        return self.transform(image), index % 1000


def resnet_path(device: torch.device, side_stream: bool) -> TransferPath:
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet18().to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def normalise(batch: Any) -> Any:
        images, labels = batch
        images = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        return images, labels

    def step(batch: Any) -> None:
        images, labels = batch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    warm = normalise(
        (
            torch.randint(0, 255, (128, 3, 224, 224), dtype=torch.uint8, device=device),
            torch.zeros(128, dtype=torch.long, device=device),
        )
    )
    for _ in range(10):
        step(warm)
    torch.cuda.synchronize(device)
    return TransferPath(device=device, side_stream=side_stream, device_transform=normalise, step_fn=step)


def trial_limits(args: Any, budget: float = 1e9, cap_scale: float = 1.0) -> Limits:
    """The trial rule autotune uses (precision, per-trial cap, batch cap); ``budget`` only bounds a whole run."""
    cap = (args.trial_seconds or max(1.0, args.budget / 15)) * cap_scale
    return Limits(budget, args.batch_budget, 0.03, 0.5, None, 0, args.precision, cap)


def make_runner(dataset: Dataset, batch_size: int, path: TransferPath, hardware: Any, limits: Limits) -> TrialRunner:
    runner = TrialRunner(dataset, batch_size, {}, hardware, path, limits)
    runner.learn_batch_size()
    return runner


def measure(runner: TrialRunner, config: Config) -> float:
    """One fresh trial of ``config`` by autotune's own rule (start-up excluded, stops once the rate is known).

    A fourth item is the sharing strategy the workers send with (autotune's pick when it measured one faster).
    """
    runner.close()  # never continue a previous measurement's workers: each point pays what a grid point pays
    trial = runner.run(*config[:3], sharing=config[3] if len(config) > 3 else None)  # type: ignore[misc]
    runner.close()
    return trial.batches_per_sec


def with_sharing(config: Config, sharing: str | None) -> Config:
    """``config`` with its workers sending by ``sharing`` (a fourth item; none for the process's own way)."""
    return config if sharing in (None, "default") or not config[0] else (*config, sharing)  # type: ignore[return-value]


#: The worker axis of the grid, cut to the workload's sensible range (see :func:`grid`).
WORKER_AXIS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
#: Past the axis for an I/O-latency loader: autotune's climb goes there (51 workers on 2 cores, session 9).
LATENCY_AXIS = (48, 64)
#: The prefetch axis of the grid.
PREFETCH_AXIS = (2, 4, 8)


def grid(
    cpus: int,
    pins: tuple[bool, ...],
    latency: bool = False,
    workers: list[int] | None = None,
    prefetches: tuple[int, ...] = PREFETCH_AXIS,
) -> list[Config]:
    """The full cross-product workers x prefetch x pin a user would run (0 workers has no prefetch).

    Workers: :data:`WORKER_AXIS` up to ``max(8, 2 x cpus)`` for a loader that computes (past twice the
    CPUs only memory and main-thread CPU are spent), the whole axis and :data:`LATENCY_AXIS` (to 64) for
    an I/O-latency loader,
    or ``workers`` when given. Pin: both where the path copies to CUDA (the stock copy or the side stream),
    left out on a CPU-only run (``pins == (False,)``: nothing is copied, so pinning would only cost the pin
    thread).
    """
    if workers:
        counts = sorted(set(workers))
    else:
        axis = WORKER_AXIS + LATENCY_AXIS if latency else WORKER_AXIS
        counts = [count for count in axis if latency or count <= max(8, 2 * cpus)]
    configs: list[Config] = []
    for count in counts:
        for pin in pins:
            configs.extend([(count, None, pin)] if count == 0 else [(count, value, pin) for value in prefetches])
    return configs


def _config(settings: Any, pins: tuple[bool, ...]) -> Config:
    workers = settings.num_workers
    pin = settings.pin_memory if settings.pin_memory in pins else pins[0]
    return workers, settings.prefetch_factor if workers else None, pin


def run_workload(name: str, label: str, dataset: Dataset, batch_size: int, path: TransferPath, args: Any) -> dict:
    hardware = probe_hardware()
    cpus = hardware.cpus_per_rank
    pins = path.pin_choices()  # what autotune searches (pinned only for the side stream)
    grid_pins = (True, False) if path.cuda else (False,)  # what a user's grid runs
    runner = make_runner(dataset, batch_size, path, hardware, trial_limits(args))
    grid_started = time.perf_counter()
    rates: dict[Config, float] = {}
    seconds: dict[Config, float] = {}
    if not path.cuda:
        print(f"  {name}/{label}: CPU-only path, pin_memory left out of the grid (nothing is copied)", flush=True)
    points = grid(cpus, grid_pins, name == "io", workers=args.grid_workers, prefetches=tuple(args.grid_prefetch))
    # each point both ways one after the other: the VM's drift over the grid does not favour one way
    points = list(dict.fromkeys(with_sharing(config, way) for config in points for way in args.grid_sharing))
    for config in points:
        started = time.perf_counter()
        rates[config] = measure(runner, config)
        seconds[config] = time.perf_counter() - started
        print(f"  {name}/{label} grid {config}: {rates[config]:.1f} batches/s ({seconds[config]:.1f} s)", flush=True)
    grid_s = time.perf_counter() - grid_started
    searched_s = sum(spent for config, spent in seconds.items() if config[2] in pins)  # the points autotune could pick
    best_config = max(rates, key=rates.get)
    accelerator = "cuda" if path.cuda else "cpu"
    policy = _config(recommend_loader_settings(hardware, accelerator=accelerator), pins)
    tuned = autotune_loader(
        dataset,
        batch_size,
        hardware=hardware,
        path=path,
        min_workers=0 if path.step_fn or path.step_seconds or path.host_step_seconds else args.min_workers,
        time_budget=args.budget,
        batch_budget=args.batch_budget,
        precision=args.precision,
        trial_seconds=args.trial_seconds,
        force=True,
        cache_path=os.path.join(args.cache_dir, "autotune_bench.json"),
        progress="log",
    )
    chosen = with_sharing(_config(tuned.settings, pins), tuned.sharing_strategy)  # as the user runs it
    # The grid's best is not its single fastest measurement (the winner's curse: the largest of many noisy
    # measurements is biased upwards): its --grid-top fastest points are measured again with the named
    # rows, and the grid best is the one of them fastest on re-measurement.
    contenders = sorted(rates, key=rates.get, reverse=True)[: max(1, args.grid_top)]
    final_runner = make_runner(dataset, batch_size, path, hardware, trial_limits(args, cap_scale=2.0))
    distinct = list(dict.fromkeys([policy, chosen, *contenders]))
    per_config: dict[Config, list[float]] = {config: [] for config in distinct}
    rounds: list[dict[Config, float]] = []
    for repeat in range(args.repeats):  # interleaved, the order reversed every other repeat, fresh workers
        rates_now = {config: measure(final_runner, config) for config in distinct[:: 1 if repeat % 2 == 0 else -1]}
        rounds.append(rates_now)
        for config, rate in rates_now.items():
            per_config[config].append(rate)
    reference = max(contenders, key=lambda config: statistics.median(per_config[config]))
    named = {"policy": policy, "autotune": chosen, "grid best": reference}
    pairs = {config: [now[config] / now[reference] for now in rounds] for config in distinct}
    # Head to head: autotune's pick against the grid best, in interleaved pairs with four times the trial
    # cap, until the mean ratio is known within --resolve (standard error of the mean log-ratio) or
    # --max-pairs pairs (or --deadline) are spent: the 2% target is only read where it is resolvable.
    long_runner = make_runner(dataset, batch_size, path, hardware, trial_limits(args, cap_scale=4.0))
    head_to_head = 0
    while chosen != reference and head_to_head < args.max_pairs and time.perf_counter() < args.deadline_at:
        if head_to_head >= 2 and _ratio_stats(pairs[chosen])[1] <= args.resolve:
            break
        order = (chosen, reference) if head_to_head % 2 == 0 else (reference, chosen)
        got = {item: measure(long_runner, item) for item in order}
        for config in distinct:
            if config in got:
                per_config[config].append(got[config])
        pairs[chosen].append(got[chosen] / got[reference])
        pairs[reference].append(1.0)
        if policy == chosen:
            pairs[policy] = pairs[chosen]
        head_to_head += 1
    ratios = {row: pairs[config] for row, config in named.items()}
    samples = {row: per_config[config] for row, config in named.items()}
    rows = []
    for row, config in named.items():
        mean, error, low, high = _ratio_stats(ratios[row])
        rate = statistics.median(per_config[config]) * batch_size
        known = f"{100 * mean:.1f}% ± {200 * error:.1f}" if math.isfinite(error) else f"{100 * mean:.1f}%"
        row_name = f"{row} + {config[3]} sharing" if len(config) > 3 else row  # type: ignore[misc]
        rows.append([name, label, row_name, *config[:3], f"{rate:,.0f}", known, f"{100 * low:.0f}-{100 * high:.0f}%"])
    share = 100 * tuned.search_seconds / grid_s
    subset = f"; {100 * tuned.search_seconds / searched_s:.0f}% of its pinned half" if pins != grid_pins else ""
    summary = (
        f"{name}/{label}: autotune {tuned.search_seconds:.1f} s ({len(tuned.trials)} trials, "
        f"{sum(trial.measurements for trial in tuned.trials)} measurements) vs grid {grid_s:.1f} s "
        f"({len(rates)} points, sharing {'+'.join(args.grid_sharing)}, same trial rule): {share:.0f}%{subset}; "
        f"grid best {reference} (of its top "
        f"{len(contenders)}, re-measured; single-measurement best {best_config}); head-to-head pairs "
        f"{head_to_head}; autotune/grid best {rows[1][-2]} (2 SE; {rows[1][-1]}), policy/grid best "
        f"{rows[0][-2]}; stop: {tuned.stop_reason}: {tuned.stop_detail}"
    )
    print(summary, flush=True)
    print(tuned.format(), flush=True)
    return {
        "rows": rows,
        "summary": summary,
        "search_s": tuned.search_seconds,
        "grid_s": grid_s,
        "grid_points": len(rates),
        "grid": {str(config): rate for config, rate in rates.items()},
        "grid_seconds": {str(config): spent for config, spent in seconds.items()},
        "grid_searched_s": searched_s,
        "grid_best_single": str(best_config),
        "grid_contenders": {str(config): per_config[config] for config in contenders},
        "head_to_head_pairs": head_to_head,
        "final_samples": samples,
        "final_ratios": ratios,
        "ratio_stats": {row: dict(zip(STAT_NAMES, _ratio_stats(ratios[row]), strict=True)) for row in named},
        "autotune": tuned.to_dict(),
        "cpus_per_rank": cpus,
    }


STAT_NAMES = ("mean", "se", "min", "max")


def _ratio_stats(ratios: list[float]) -> tuple[float, float, float, float]:
    """Geometric mean of within-repeat ratios, the standard error of that mean (relative), least, most."""
    logs = [math.log(max(value, 1e-9)) for value in ratios]
    error = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    return math.exp(statistics.fmean(logs)), error, min(ratios), max(ratios)


def workloads(
    names: list[str], device: torch.device | None, paths: list[str] | None = None
) -> list[tuple[str, str, Any, int, Any]]:
    """``(name, path label, dataset factory, batch size, path factory)`` for each runnable workload."""
    plans = []
    host = TransferPath(device=device)
    for name in names:
        if name == "jpeg":
            if device is None:
                print("jpeg: needs CUDA and torchvision; skipped")
                continue
            for label in paths or ["stock", "side_stream"]:
                side = label == "side_stream"
                plans.append(("jpeg", label, JpegImages, 128, lambda side=side: resnet_path(device, side)))
        elif name == "cpu":
            plans.append(("cpu", "stock" if device else "host", DecodedImages, 32, lambda: host))
        elif name == "io":
            plans.append(("io", "stock" if device else "host", SleepySamples, 16, lambda: host))
        elif name == "tiny":
            tiny = TransferPath(device=device, host_step_seconds=0.002)
            plans.append(
                ("tiny", "stock+2ms host" if device else "host+2ms host", TinySamples, 64, lambda tiny=tiny: tiny)
            )
    return plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["jpeg", "cpu", "io", "tiny"])
    parser.add_argument("--repeats", type=int, default=3, help="re-measurements of the named rows")
    parser.add_argument("--budget", type=float, default=30.0, help="autotune time budget (s)")
    parser.add_argument(
        "--min-workers", type=int, default=1, help="as TunedDataModule: 1 (0 where the workload models its step)"
    )
    parser.add_argument("--grid-workers", type=int, nargs="+", default=None, help="worker counts of the grid")
    parser.add_argument("--grid-prefetch", type=int, nargs="+", default=list(PREFETCH_AXIS), help="prefetch axis")
    parser.add_argument("--paths", nargs="+", choices=["stock", "side_stream"], default=None, help="jpeg's paths")
    parser.add_argument(
        "--grid-sharing",
        nargs="+",
        choices=["default", FAST_HANDOVER],
        default=["default"],
        help="how the grid's workers send batches (autotune measures file_system where its climb stops)",
    )
    parser.add_argument("--grid-top", type=int, default=3, help="grid points re-measured to find the grid best")
    parser.add_argument("--resolve", type=float, default=0.01, help="head-to-head until the ratio's SE is this")
    parser.add_argument("--max-pairs", type=int, default=8, help="most head-to-head pairs (autotune vs grid best)")
    parser.add_argument("--deadline", type=float, default=None, help="no new head-to-head pair after this (s)")
    parser.add_argument("--precision", type=float, default=0.03, help="trial precision (autotune's and the grid's)")
    parser.add_argument("--trial-seconds", type=float, default=None, help="cap per trial (default budget / 15)")
    parser.add_argument("--batch-budget", type=int, default=400, help="most batches per trial")
    parser.add_argument("--cpus", type=int, default=None, help="pin this process (and workers) to N cores")
    parser.add_argument("--cache-dir", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--cpu", action="store_true", help="do not copy to the GPU even if there is one")
    parser.add_argument("--name", default=None, help="results file name")
    args = parser.parse_args()
    args.deadline_at = time.perf_counter() + args.deadline if args.deadline else math.inf
    if args.cpus:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])
        torch.set_num_threads(args.cpus)  # as a process started on N cores has (PyTorch counts them at start-up)
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.cpu else None
    payload: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "deadline_at"}, "workloads": {}}
    rows, summaries = [], []
    for name, label, factory, batch_size, make_path in workloads(args.workloads, device, args.paths):
        with gc_frozen():  # as in the search: collecting a trial's loader walks only what was made since
            result = run_workload(name, label, factory(), batch_size, make_path(), args)
        payload["workloads"][f"{name}/{label}"] = result
        rows.extend(result["rows"])
        summaries.append(result["summary"])
        write_json(args.name or f"autotune_{'cuda' if device else 'cpu'}", payload)
    headers = ["workload", "path", "row", "workers", "prefetch", "pin", "samples/s", "of grid best ± 2 SE", "spread"]
    payload["table"] = print_table(headers, rows)
    payload["summaries"] = summaries
    print("\n".join(summaries))
    write_json(args.name or f"autotune_{'cuda' if device else 'cpu'}", payload)


if __name__ == "__main__":
    main()
