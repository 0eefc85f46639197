"""Where to decode JPEGs for a fast model: CPU workers, the GPU path, or split between them (issue 46), side by side.

Every row (ResNet-18 / ResNet-50, bf16-mixed, batch 128, channels-last, eager and
``torch.compile(mode="reduce-overhead")``, uniform 320 px and varied 200-500 px JPEGs from
``benchmarks/gpu_decode.py``) in one run, in a real ``Trainer``, repeated in interleaved rounds (``--rounds``, the
spread reported). Columns, images/s:

- ``ceiling``: the same step fed one batch already on the GPU;
- ``cpu``: ``GpuDecodeLoader(gpu_share=0)``: the workers decode, crop, resize and flip every image (uint8, pinned),
  the GPU only normalises; the best of ``--cpu-workers`` counts (default up to cores - 1);
- ``gpu``: ``gpu_share=1`` (the GPU path as before issue 46) over ``--gpu-workers`` workers;
- ``share=s``: split decode at each of ``--shares`` over ``--split-workers`` workers; ``best share``: the best
  of the fixed shares measured, the two ends included;
- ``dali``: DALI's pipeline on the same files (``benchmarks/gpu_decode_dali.py``), where ``nvidia.dali`` imports;
- ``loop``: a ``TunedDataModule(gpu_decode=GpuDecodeOptions(...), autotune=OnlineTuning())`` at its defaults (the
  policy's workers, the GPU end: what a GPU-decode user upgrading runs), planned for ``--loop-planned`` steps (its
  cost cap is ``max_cost`` of those), timed over ``--loop-steps`` steps from ``--loop-settle`` steps after the loop
  is done (the switch to the kept setting left out): the setting it kept,
  its rate over those steps, and the search's cost beside its cap.

Prints a table and writes JSON (``$OUT`` or ``benchmarks/results``). torchvision and DALI are imported lazily.

    PYTHONPATH=$PWD python benchmarks/decode_placement.py --quick          # < 8 minutes on one H200
    PYTHONPATH=$PWD python benchmarks/decode_placement.py                  # every column, 2 rounds
    PYTHONPATH=$PWD python benchmarks/decode_placement.py --dry-run        # CPU, tiny: the code paths only
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    cores = _cores()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--sets", nargs="+", default=["uniform", "varied"], choices=["uniform", "varied"])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--steps", type=int, default=120, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--compile-warmup", type=int, default=10, help="more warm-up steps for compiled rows")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repeats of every row (at least 2)")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    default_cpu = sorted({max(1, cores - 1), max(1, 3 * (cores - 1) // 4), max(1, (cores - 1) // 2)}, reverse=True)
    parser.add_argument("--cpu-workers", type=int, nargs="+", default=default_cpu, help="gpu_share=0: best of these")
    parser.add_argument("--gpu-workers", type=int, default=4, help="gpu_share=1: workers that only read files")
    parser.add_argument("--split-workers", type=int, default=max(1, cores - 1))
    parser.add_argument("--cpu-decoder", default="auto", help="the CPU share's decoder: auto, pil, torchvision")
    parser.add_argument("--no-dali", action="store_true", help="leave DALI's column out")
    parser.add_argument("--no-loop", action="store_true", help="leave the online loop's column out")
    parser.add_argument("--loop-planned", type=int, default=20_000, help="the loop's run, planned steps (its cap)")
    parser.add_argument("--loop-steps", type=int, default=150, help="steps timed once the loop is done")
    parser.add_argument("--loop-settle", type=int, default=30, help="steps after the loop is done before the timing")
    parser.add_argument("--loop-seconds", type=float, default=150.0, help="the loop's fit stops here regardless")
    parser.add_argument("--loop-rounds", type=int, default=None, help="the loop's column in the last N rounds only")
    parser.add_argument("--quick", action="store_true", help="fewer steps, one CPU worker count, shares 0.5 only")
    parser.add_argument("--root", default=None, help="where the JPEG sets go (default: a temporary folder)")
    parser.add_argument("--name", default="decode_placement")
    parser.add_argument("--dry-run", action="store_true", help="CPU, 40 images, tiny model, 2+2 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.compile_warmup = 50, 10, 10
        args.cpu_workers, args.shares, args.images = args.cpu_workers[:1], [0.5], min(args.images, 1000)
    if args.dry_run:
        args.images, args.steps, args.warmup, args.compile_warmup = 40, 2, 2, 0
        args.modes, args.models, args.cpu_workers = ["eager"], args.models[:1], [0]
        args.gpu_workers = args.split_workers = 0
        args.no_dali = True
        args.loop_steps, args.loop_seconds, args.loop_settle = 4, 20.0, 0
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def _loader(samples, workers: int, total: int, batch: int, share: float, device: str, cpu_decoder: str):
    """``total`` batches drawn with replacement through the package's path at ``gpu_share=share``."""
    from torch.utils.data import DataLoader, RandomSampler

    from lightning_dataperf.decode import GpuDecodeLoader
    from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

    dataset = EncodedImageDataset(samples, seed=0)
    sampler = RandomSampler(range(len(samples)), replacement=True, num_samples=total * batch)
    base = DataLoader(
        dataset, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=collate_encoded,
        pin_memory=device == "cuda", prefetch_factor=4 if workers else None, drop_last=True,
    )  # fmt: skip
    return GpuDecodeLoader(base, device=device, dtype=torch.bfloat16, gpu_share=share, cpu_decoder=cpu_decoder)


def _columns(args) -> list[tuple[str, dict[str, Any]]]:
    """``(column, what it runs)`` in the order each round runs them."""
    columns = [(f"cpu w={w}", {"share": 0.0, "workers": w}) for w in args.cpu_workers]
    columns.append(("gpu", {"share": 1.0, "workers": args.gpu_workers}))
    columns += [(f"share={s:g}", {"share": s, "workers": args.split_workers}) for s in args.shares if 0 < s < 1]
    if not args.no_dali:
        columns.append(("dali", {"dali": True}))
    return columns


def _fit(gd, module, loader, warmup: int, steps: int, cuda: bool) -> dict:
    try:
        return gd.e2e_fit(module, loader, warmup, steps, cuda)
    finally:
        if hasattr(loader, "close"):
            loader.close()


def loop_fit(gd, module, samples, args, cuda: bool) -> dict:
    """The ``loop`` column: one online fit from the defaults, timed over ``--loop-steps`` once the loop is done."""
    import lightning.pytorch as pl
    from _common import quiet_trainer
    from torch.utils.data import DataLoader

    from lightning_dataperf import GpuDecodeOptions, OnlineTuning, TunedDataModule
    from lightning_dataperf.decode.encoded import EncodedImageDataset

    tuning = OnlineTuning()

    class Jpegs(TunedDataModule):
        def train_dataloader(self) -> DataLoader:
            # 8 passes over the files an epoch: epochs of about 125 batches, as a real dataset's are long
            dataset = EncodedImageDataset(samples * 8, seed=0)
            return DataLoader(dataset, batch_size=gd.BATCH, shuffle=True, drop_last=True)

    options = GpuDecodeOptions(size=gd.SIZE, dtype=torch.bfloat16, cpu_decoder=args.cpu_decoder)
    data = Jpegs(seed=0, verbose=False, autotune=tuning, gpu_decode=options)
    clock = gd._Clock(0, cuda)
    state = {"done": None, "after": None, "began": time.perf_counter()}

    class StopWhenDone(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            result = data.online_result
            if state["done"] is None and result is not None and result.done:
                state["done"] = trainer.global_step
            # timed from --loop-settle steps on: the switch to the kept setting (workers restarting) stays out
            settled = state["done"] is not None and trainer.global_step - state["done"] >= args.loop_settle
            if state["after"] is None and settled:
                state["after"], clock.begin = trainer.global_step, clock._mark()
            over = time.perf_counter() - state["began"] > args.loop_seconds
            if over or (state["after"] is not None and trainer.global_step - state["after"] >= args.loop_steps):
                trainer.should_stop = True

    trainer = quiet_trainer(
        accelerator="gpu" if cuda else "cpu", precision="bf16-mixed", max_steps=args.loop_planned, max_epochs=-1,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[StopWhenDone(), clock.callback],
        default_root_dir=tempfile.mkdtemp(prefix="placement_loop_"),
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    result = data.online_result
    steps = trainer.global_step - (state["after"] or 0)
    timed = state["after"] is not None and steps > 0
    seconds = clock.seconds() if timed else 0.0
    kept = result.kept.setting if result is not None and result.kept is not None else None
    planned_rate = result.start.steps_per_sec if result is not None and result.start is not None else 0.0
    return {
        "images_per_s": steps * gd.BATCH / seconds if timed and seconds else 0.0,
        "done": bool(result and result.done),
        "kept": "-" if kept is None else f"{kept.num_workers}w share {kept.gpu_share}",
        "kept_setting": None if kept is None else dataclasses.asdict(kept),
        "kept_rate_in_run": result.kept.steps_per_sec * gd.BATCH if result is not None and result.kept else None,
        "cost_s": result.cost_s if result is not None else None,
        "cap_s": result.cap_s
        if result is not None and result.cap_s is not None
        else (tuning.max_cost * args.loop_planned / planned_rate if planned_rate else None),
        "stop_reason": result.stop_reason if result is not None else "",
        "share_ends": {f"{k:g}": v.steps_per_sec * gd.BATCH for k, v in result.share_ends.items()} if result else {},
        "summary": result.summary() if result is not None else "",
        "search_steps": state["done"],
    }


def run_round(gd, sets: dict, modules: dict, args, cuda: bool, rates: dict, loops: dict, number: int = 0) -> None:
    """One round of every row and column; ``rates[(model, mode, set, column)]`` gets this round's images/s,
    ``loops[(model, mode, set)]`` the loop column's record."""
    device = "cuda" if cuda else "cpu"
    for (arch, mode), module in modules.items():
        warmup = args.warmup + (args.compile_warmup if mode == "compiled" else 0)
        total = warmup + args.steps
        try:
            ceiling = _fit(gd, module, gd._OnGpu(total, device), warmup, args.steps, cuda)
        except Exception:
            # a mode that fails (no Triton, say) must not lose the other rows
            traceback.print_exc()
            continue
        for kind in sets:
            rates.setdefault((arch, mode, kind, "ceiling"), []).append(ceiling["images_per_s"])
        print(f"{arch} {mode}: ceiling {ceiling['images_per_s']:.0f} img/s", flush=True)
        for kind, samples in sets.items():
            for column, spec in _columns(args):
                try:
                    if spec.get("dali"):
                        from gpu_decode_dali import DaliLoader, dali_pipeline

                        threads = max(1, args.gpu_workers)
                        pipeline = dali_pipeline(samples, gd.BATCH, gd.SIZE, threads=threads, device="gpu")
                        loader: Any = DaliLoader(pipeline, total)
                    else:
                        loader = _loader(
                            samples, spec["workers"], total, gd.BATCH, spec["share"], device, args.cpu_decoder
                        )
                    row = _fit(gd, module, loader, warmup, args.steps, cuda)
                except Exception:
                    # DALI absent, or one column failing, must not lose the others
                    traceback.print_exc()
                    continue
                rates.setdefault((arch, mode, kind, column), []).append(row["images_per_s"])
                share = row["images_per_s"] / ceiling["images_per_s"]
                print(f"  {kind:8s} {column:12s} {row['images_per_s']:8.0f} img/s {100 * share:5.1f}%", flush=True)
            if not args.no_loop and (args.loop_rounds is None or number >= args.rounds - args.loop_rounds):
                try:
                    got = loop_fit(gd, module, samples, args, cuda)
                except Exception:
                    traceback.print_exc()
                    continue
                loops.setdefault((arch, mode, kind), []).append(got)
                if got["images_per_s"]:  # 0: not timed, the search had not ended (its record says so)
                    rates.setdefault((arch, mode, kind, "loop"), []).append(got["images_per_s"])
                print(f"  {kind:8s} {'loop':12s} {got['images_per_s']:8.0f} img/s  kept {got['kept']}", flush=True)


def _cell(values: list[float] | None, ceiling: float) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    spread = (max(values) - min(values)) / mean if mean else 0.0
    share = f" ({100 * mean / ceiling:.0f}%)" if ceiling else ""
    return f"{mean:,.0f}{share} ±{100 * spread / 2:.1f}%"


def _loop_cell(records: list[dict] | None, rates: list[float] | None, ceiling: float) -> str:
    if not records:
        return "-"
    kept = ", ".join(sorted({record["kept"] for record in records}))
    if not rates:
        return f"{kept}: not timed (the search had not ended by --loop-seconds)"
    return f"{kept}: {_cell(rates, ceiling)}"


def summarise(rates: dict, args, loops: dict | None = None) -> tuple[list[dict], list[str], list[list[str]]]:
    """Per row: each column's mean over the rounds and spread, the best CPU worker count, the best fixed share,
    and the loop's pick against it."""
    loops = loops or {}
    rows, table = [], []
    columns = [name for name, _ in _columns(args)]
    keys = sorted({key[:3] for key in rates})
    for arch, mode, kind in keys:
        got = {column: rates.get((arch, mode, kind, column)) for column in ["ceiling", *columns, "loop"]}
        ceiling = statistics.fmean(got["ceiling"]) if got["ceiling"] else 0.0
        means = {column: statistics.fmean(values) for column, values in got.items() if values}
        cpu = [column for column in means if column.startswith("cpu")]
        best_cpu = max(cpu, key=means.__getitem__) if cpu else None
        shares = {column: means[column] for column in means if column == "gpu" or column.startswith("share=")}
        if best_cpu is not None:
            shares[best_cpu] = means[best_cpu]
        best_share = max(shares, key=shares.__getitem__) if shares else None
        single = max((means[c] for c in (best_cpu, "gpu") if c in means), default=0.0)
        best_rate = shares.get(best_share or "", 0.0)
        loop = loops.get((arch, mode, kind), [])
        rows.append({
            "loop": loop, "loop_of_best_share": means["loop"] / best_rate if "loop" in means and best_rate else None,
            "model": arch, "mode": mode, "set": kind, "rates": got, "means": means, "best_cpu": best_cpu,
            "best_share": best_share, "best_share_rate": shares.get(best_share or "", 0.0),
            "better_single_path": single,
            "best_over_single": shares.get(best_share or "", 0.0) / single if single else None,
        })  # fmt: skip
        best = "-" if best_share is None else f"{best_share}: {_cell(got[best_share], ceiling)}"
        table.append([
            arch, mode, kind, _cell(got["ceiling"], 0.0),
            "-" if best_cpu is None else f"{best_cpu[4:]}: {_cell(got[best_cpu], ceiling)}",
            _cell(got.get("gpu"), ceiling),
            *(_cell(got.get(c), ceiling) for c in columns if c.startswith("share=")),
            best, _cell(got.get("dali"), ceiling), _loop_cell(loop, rates.get((arch, mode, kind, "loop")), ceiling),
            "-" if "loop" not in means or not best_rate else f"{100 * means['loop'] / best_rate:.0f}%",
            ", ".join(f"{r['cost_s']:.1f}/{r['cap_s']:.0f} s" for r in loop if r["cost_s"] is not None and r["cap_s"]),
        ])  # fmt: skip
    headers = ["model", "mode", "set", "ceiling", "cpu only (workers)", "gpu only"]
    headers += [c for c in columns if c.startswith("share=")] + ["best fixed share", "dali"]
    headers += ["loop kept", "loop / best", "loop cost / cap"]
    return rows, headers, table


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import gpu_decode as gd
    from _common import print_table, write_json

    cuda = torch.cuda.is_available() and not args.dry_run
    if args.dry_run:
        gd.BATCH = 8
    torch.backends.cudnn.benchmark = True
    root = args.root or tempfile.mkdtemp(prefix="decode_placement_")
    sets = {}
    for kind in args.sets:
        began = time.perf_counter()
        sets[kind], mean_bytes = gd.make_set(os.path.join(root, kind), kind, args.images)
        print(f"{kind}: {args.images} JPEGs, mean {mean_bytes / 1e3:.1f} kB, {time.perf_counter() - began:.1f} s")
    # one module per model and mode for every column and round: compiled once
    modules = {
        (arch, mode): gd.e2e_module(arch, mode == "compiled", tiny=args.dry_run)
        for arch in args.models
        for mode in args.modes
    }
    rates: dict = {}
    loops: dict = {}
    began = time.perf_counter()
    for number in range(args.rounds):
        print(f"round {number + 1} of {args.rounds} ({time.perf_counter() - began:.0f} s so far)", flush=True)
        run_round(gd, sets, modules, args, cuda, rates, loops, number)
        rows, headers, table = summarise(rates, args, loops)
        print(f"{number + 1} rounds in {time.perf_counter() - began:.0f} s; mean (share of ceiling) ±half the spread")
        text = print_table(headers, table)
        # after every round: a run stopped at its time limit keeps the rounds it finished
        rounds = {"rounds_done": number + 1, "table": text, "rates": {"|".join(k): v for k, v in rates.items()}}
        write_json(args.name, {"args": vars(args), "rows": rows, **rounds})


if __name__ == "__main__":
    main()
