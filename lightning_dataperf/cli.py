"""The lightning-dataperf command: ``probe`` the hardware, ``report`` a finished run.

Nothing heavy (torch, Lightning, TensorBoard, matplotlib) is imported before the arguments are parsed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["build_parser", "main"]

DESCRIPTION = """\
Look at the hardware this process sees, and at a finished run's DataPerf logs.

commands:
  probe    print the CPUs, GPUs, memory and storage this process may use, and the
           DataLoader settings recommended for them, with reasons
  report   draw a one-page summary (PNG, optionally HTML) of a run: where each step's
           time goes, the share of step time lost to input, GPU or CPU use, the verdict;
           written into the run's folder (dataperf_report.png), never over an earlier one
           unless --force

examples:
  lightning-dataperf probe --data-path /data/imagenet --local-world-size 4
  lightning-dataperf report dataperf_logs/quickstart
  lightning-dataperf report dataperf_logs/quickstart --run version_0 --html
"""


def _probe(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from lightning_dataperf.telemetry.hardware import usable_cpus

    if args.data_path is not None and not os.path.exists(args.data_path):
        parser.error(
            f"--data-path {args.data_path}: no such file or directory. Pass the folder (or file) that holds "
            "the dataset, or leave --data-path out to skip the storage check."
        )
    if args.local_world_size is not None:
        cpus, source = usable_cpus()
        if args.local_world_size < 1:
            parser.error(
                f"--local-world-size {args.local_world_size}: must be at least 1 (the number of training "
                "processes you will run on this machine)."
            )
        if args.local_world_size > cpus:
            parser.error(
                f"--local-world-size {args.local_world_size}: more ranks than the {cpus} CPU(s) this process may "
                f"use ({source}); each rank needs at least one CPU. Pass at most {cpus}, or run with more CPUs."
            )
        os.environ["LOCAL_WORLD_SIZE"] = str(args.local_world_size)
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs {args.epochs}: must be at least 1.")

    from lightning_dataperf.loader.policy import recommend_loader_settings
    from lightning_dataperf.telemetry.hardware import probe_hardware

    hardware = probe_hardware(args.data_path)
    settings = recommend_loader_settings(hardware, max_epochs=args.epochs)
    if args.json:
        payload = {
            "hardware": hardware.to_dict(),
            "settings": {**settings.as_kwargs(), "reasons": dict(settings.reasons)},
        }
        print(json.dumps(payload, indent=2, default=str))
        return 0
    print(
        f"CPUs: {hardware.usable_cpus} usable ({hardware.usable_cpus_source}) of {hardware.logical_cpus} logical, "
        f"{hardware.physical_cpus} physical; {hardware.local_world_size} local rank(s) -> "
        f"{hardware.cpus_per_rank} per rank"
    )
    for gpu in hardware.gpus:
        link = f"PCIe gen {gpu.pcie_generation} x{gpu.pcie_width}" if gpu.pcie_generation else "PCIe link unknown"
        print(f"GPU {gpu.index}: {gpu.name}, {gpu.memory_total_mb or 0:.0f} MB, {link}")
    if not hardware.gpus:
        print(f"GPUs: none visible through NVML (accelerator: {hardware.accelerator})")
    shm = f"{hardware.shm_free_mb:.0f} of {hardware.shm_total_mb:.0f} MB free" if hardware.shm_total_mb else "unknown"
    print(f"RAM: {hardware.ram_available_mb:.0f} of {hardware.ram_total_mb:.0f} MB available; /dev/shm: {shm}")
    if hardware.storage is not None:
        storage = hardware.storage
        print(f"Storage of {storage.path}: {storage.kind} ({storage.filesystem}, device {storage.device})")
    print(f"Worker start method: {hardware.start_method}")
    for note in hardware.notes:
        print(f"Note: {note}")
    print(settings.explain())
    return 0


REPORT_NAME = "dataperf_report.png"


def _fail(message: str) -> int:
    print(f"lightning-dataperf report: error: {message}", file=sys.stderr)
    return 2


def _report_paths(args: argparse.Namespace, run_directory: Path) -> tuple[Path, Path | None] | str:
    """Where the PNG (and the page) go: ``--out`` (a file, or a folder), else the run's own folder; an error's
    text instead where the suffix is not ``.png`` or an earlier report would be replaced without ``--force``."""
    png = Path(args.out) if args.out else run_directory / REPORT_NAME
    # "DIR/", an existing folder or a name without a suffix means a folder (made if missing), not a file
    if png.is_dir() or (args.out and (args.out.endswith(("/", os.sep)) or not png.suffix)):
        png = png / REPORT_NAME
    if png.suffix.lower() != ".png":
        return (
            f"--out {args.out}: the report is a PNG; pass a path ending in .png (the page goes next to it), "
            f"or a folder to write {REPORT_NAME} into."
        )
    page = png.with_suffix(".html") if args.html else None
    existing = [str(path) for path in (png, page) if path is not None and path.exists()]
    if existing and not args.force:
        return (
            f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''} (an earlier report): pass "
            f"--force to replace {'it' if len(existing) == 1 else 'them'}, or --out PATH to write this one elsewhere."
        )
    return png, page


def _report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from lightning_dataperf.report.page import render_html
    from lightning_dataperf.report.run import load_run, render_png

    try:
        run = load_run(args.logdir, run=args.run)
    except (FileNotFoundError, LookupError) as error:
        return _fail(str(error))
    for skipped in run.skipped:
        print(f"lightning-dataperf report: warning: {skipped}", file=sys.stderr)
    paths = _report_paths(args, run.directory)
    if isinstance(paths, str):
        return _fail(paths)
    png, page = paths
    where = f" ({', '.join(run.sources)})" if run.sources else ""
    if run.other_runs:
        print(
            f"drew run {run.name}{where}, the latest of {len(run.other_runs) + 1} in {args.logdir}; not drawn: "
            f"{', '.join(run.other_runs)} (pick one with --run NAME)"
        )
    else:
        print(f"drew run {run.directory}{where}")
    try:
        png.parent.mkdir(parents=True, exist_ok=True)
        render_png(run, png)
        print(f"wrote {png}")
        if page is not None:
            render_html(run, png, page)
            print(f"wrote {page} (open it in a browser)")
    except OSError as error:
        return _fail(
            f"cannot write {error.filename or png}: {error.strerror}; pass --out PATH in a folder you can write."
        )
    print(run.diagnosis_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (cheap: imports nothing heavy)."""
    parser = argparse.ArgumentParser(
        prog="lightning-dataperf", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{probe,report}")
    probe = commands.add_parser(
        "probe",
        help="hardware this process sees and recommended DataLoader settings",
        description="Print the CPUs, GPUs, memory and storage this process may use, and the DataLoader "
        "settings recommended for them, with the reason for each.",
    )
    probe.add_argument("--json", action="store_true", help="print JSON instead of text")
    probe.add_argument("--data-path", metavar="PATH", help="dataset location (must exist), to classify its storage")
    probe.add_argument(
        "--local-world-size",
        type=int,
        metavar="N",
        help="training processes (ranks) you will run on this machine, 1 to the usable CPUs "
        "(default: LOCAL_WORLD_SIZE or SLURM settings, else 1)",
    )
    probe.add_argument("--epochs", type=int, metavar="N", help="planned epochs (decides persistent_workers)")
    report = commands.add_parser(
        "report",
        help="one-page PNG/HTML summary of a run's DataPerf logs",
        description="Draw a one-page summary of one run from its TensorBoard event files (or a CSV "
        "logger's metrics.csv) and dataperf_summaries.jsonl. A folder holding several runs draws the "
        "latest and names the others; --run picks one.",
    )
    report.add_argument("logdir", help="a run's log directory (e.g. lightning_logs/version_0) or a folder of runs")
    report.add_argument("--run", metavar="NAME", help="which run to draw when LOGDIR holds several (e.g. version_0)")
    report.add_argument(
        "--out",
        metavar="PATH",
        help=f"PNG path, or a folder for {REPORT_NAME}, made if missing (default: {REPORT_NAME} in the folder of "
        "the run drawn)",
    )
    report.add_argument(
        "--html",
        action="store_true",
        help="also write a self-contained HTML page next to the PNG (verdict, epoch table, figure)",
    )
    report.add_argument("--force", action="store_true", help="replace an earlier report at that path")
    report.set_defaults(run_command=_report, command_parser=report)
    probe.set_defaults(run_command=_probe, command_parser=probe)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the lightning-dataperf command."""
    args = build_parser().parse_args(argv)
    return int(args.run_command(args, args.command_parser))


if __name__ == "__main__":
    sys.exit(main())
