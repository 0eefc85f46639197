"""Replay autotune's choice over the trials a benchmark run recorded: what today's ``choose()`` picks from them.

No new measurement: each named ``results/<name>.json`` of ``benchmarks/autotune.py`` holds the search's
trials (merged repeats included); the choice runs over them with no budget left (nothing re-measured), the
policy's pick (the first trial) as the floor. Prints a table and writes JSON.

    python benchmarks/autotune_replay.py autotune_h200_jpeg_stock_s9 autotune_h200_jpeg_stock_s10_pickcheck
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from collections.abc import Iterator

from _common import ROOT, print_table, write_json

from lightning_dataperf.autotune.choice import choose
from lightning_dataperf.autotune.search import Search
from lightning_dataperf.autotune.trial import Limits, Trial

FIELDS = {field.name for field in dataclasses.fields(Trial)}


class RecordedTrials:
    """The runner's face ``choose()`` needs, over recorded trials, with no budget left."""

    def __init__(self, trials: dict) -> None:
        self.trials, self.remaining = trials, 0.0

    def remeasure(self, trial: Trial, cap_scale: float = 1.0, against: Trial | None = None) -> Trial:
        return trial

    @contextlib.contextmanager
    def reserved(self, seconds: float) -> Iterator[None]:
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help="results/<name>.json files of benchmarks/autotune.py")
    parser.add_argument("--name", default="autotune_replay")
    args = parser.parse_args()
    rows, out = [], {}
    for name in args.names:
        payload = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
        for label, workload in payload["workloads"].items():
            trials = [Trial(**{k: v for k, v in t.items() if k in FIELDS}) for t in workload["autotune"]["trials"]]
            runner = RecordedTrials({trial.config: trial for trial in trials})
            pins = tuple(dict.fromkeys(trial.pin_memory for trial in trials))
            search = Search(runner, {}, pins, Limits(30.0, 400, 0.03, 0.5, None, 0), workload["cpus_per_rank"])  # type: ignore[arg-type]
            picked = choose(search, trials[0], 0.02, seconds=0.0)
            settings = workload["autotune"]["settings"]
            recorded = (settings["num_workers"], settings["prefetch_factor"], settings["pin_memory"])
            rows.append([name, label, str(recorded), str(picked.config)])
            out[f"{name}:{label}"] = {"recorded": recorded, "replayed": picked.config}
    table = print_table(["results", "workload", "recorded pick", "replayed pick"], rows)
    write_json(args.name, {"args": vars(args), "picks": out, "table": table})


if __name__ == "__main__":
    main()
