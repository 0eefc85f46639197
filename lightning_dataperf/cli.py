"""``lightning-dataperf``: look at the hardware, and at a finished run.

lightning-dataperf probe [--json] [--data-path DIR] [--local-world-size N] [--epochs N]
lightning-dataperf report LOGDIR [--out report.png] [--html]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from lightning_dataperf.hardware import probe_hardware
from lightning_dataperf.policy import recommend_loader_settings

__all__ = ["main"]


def _probe(args: argparse.Namespace) -> int:
    if args.local_world_size:
        os.environ["LOCAL_WORLD_SIZE"] = str(args.local_world_size)
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


def _report(args: argparse.Namespace) -> int:
    from lightning_dataperf.report import load_run, render_html, render_png

    try:
        run = load_run(args.logdir)
    except FileNotFoundError as error:
        print(f"lightning-dataperf report: {error}", file=sys.stderr)
        return 2
    png = render_png(run, args.out)
    print(f"wrote {png}")
    if args.html:
        page = render_html(run, png, png.with_suffix(".html"))
        print(f"wrote {page}")
    print(run.diagnosis_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-dataperf", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    probe = commands.add_parser("probe", help="hardware this process sees and recommended DataLoader settings")
    probe.add_argument("--json", action="store_true", help="print JSON")
    probe.add_argument("--data-path", help="dataset location, to classify its storage")
    probe.add_argument("--local-world-size", type=int, help="ranks per node you will run (default: from env)")
    probe.add_argument("--epochs", type=int, help="planned epochs (for persistent_workers)")
    probe.set_defaults(run=_probe)
    report = commands.add_parser("report", help="one-page PNG/HTML summary of a run's DataPerf logs")
    report.add_argument("logdir", help="the run's log directory (e.g. lightning_logs/version_0)")
    report.add_argument("--out", default="dataperf_report.png", help="PNG path (default: %(default)s)")
    report.add_argument("--html", action="store_true", help="also write a self-contained HTML page")
    report.set_defaults(run=_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lightning-dataperf`` command."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
