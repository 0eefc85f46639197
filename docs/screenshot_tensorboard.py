"""Screenshot TensorBoard on a finished run with headless Chromium (how docs/tensorboard_*.png are made).

Starts TensorBoard on LOGDIR, waits until it answers, takes one headless-Chromium screenshot per page
(the Time/DataLoading and Time/Compute charts, the Custom Scalars page, the Time Series page), then
stops TensorBoard. Needs only the package's own dependencies and Chromium (Debian: apt-get install -y
chromium); no Playwright.

    python examples/quickstart.py --logdir /tmp/qs
    python docs/screenshot_tensorboard.py /tmp/qs --out-dir docs

Options: --port (default 6007), --chromium (default: chromium or chromium-browser on PATH), --wait
(seconds of page time Chromium gives TensorBoard to load its data, default 15).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# output file -> TensorBoard page
PAGES = {
    "tensorboard_scalars.png": "#scalars&tagFilter=%5ETime%2F(DataLoading%7CCompute)%24",
    "tensorboard_custom_scalars.png": "#custom_scalars",
    "tensorboard_time_series.png": "#timeseries",
}


def _free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def _wait_for(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"TensorBoard did not answer at {url} within {timeout:.0f} s")


def screenshot(
    chromium: str, url: str, out: Path, wait_s: float, size: tuple[int, int] = (1400, 1000), profile: str | None = None
) -> None:
    """One headless-Chromium screenshot of ``url`` into ``out`` (``profile``: Chromium's user-data folder)."""
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        *([f"--user-data-dir={profile}"] if profile else []),
        "--hide-scrollbars",
        f"--window-size={size[0]},{size[1]}",
        f"--virtual-time-budget={int(wait_s * 1000)}",  # page time for TensorBoard's data requests
        f"--screenshot={out}",
        url,
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120 + wait_s)
    if not out.is_file() or out.stat().st_size < 10_000:
        raise RuntimeError(f"Chromium wrote no usable screenshot of {url} to {out}")


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir", help="log folder of finished runs (passed to tensorboard --logdir)")
    parser.add_argument("--out-dir", default="docs", help="where the PNGs go (default: docs)")
    parser.add_argument("--port", type=int, default=6007)
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    parser.add_argument("--wait", type=float, default=15.0)
    args = parser.parse_args(argv)
    if not args.chromium:
        parser.error("no Chromium found: apt-get install -y chromium, or pass --chromium PATH")
    if not Path(args.logdir).is_dir():
        parser.error(f"{args.logdir} is not a directory")
    if not _free(args.port):
        parser.error(f"port {args.port} is in use: pass --port")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{args.port}/"
    # TensorBoard's server notes (.tensorboard-info) and Chromium's profile go into a folder removed at the end
    with tempfile.TemporaryDirectory(prefix="dataperf-screenshots-") as scratch:
        server = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", args.logdir, "--port", str(args.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": scratch},
        )
        written = []
        try:
            _wait_for(base, timeout=60)
            for name, fragment in PAGES.items():
                out = out_dir / name
                screenshot(args.chromium, base + fragment, out, args.wait, profile=os.path.join(scratch, "chromium"))
                print(f"wrote {out}")
                written.append(out)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return written


if __name__ == "__main__":
    main()
