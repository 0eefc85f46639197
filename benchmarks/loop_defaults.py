"""``TunedDataModule(autotune=OnlineTuning())`` at its defaults (no ``num_workers`` of yours) on CPU pipelines, the
package from one or two trees in interleaved runs: where the loop starts, what it keeps, the run's rate.

    PYTHONPATH=$PWD python benchmarks/loop_defaults.py --pipelines tiny dicts io --runs 2 --trees . ../before

Each run is a fit of its own in a subprocess whose ``PYTHONPATH`` is the tree (the first tree's runs and the
second's alternate, ABBA), planned at ``--seconds`` of the grid's best rate (``--planned``, steps, per pipeline) so
the 5% cost cap is of a run that long. Prints a table and writes JSON (``results/<name>.json``, or under ``$OUT``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

#: Steps in 60 s at the grid's best rate on the 2-core VM (results/online_looks_10runs_2908c97.json,
#: results/online_defaults_grid_s55.json): the run each fit is planned as.
PLANNED = {"tiny": 77_640, "dicts": 60_960, "io": 3_516, "quickstart": 3_270, "collate": 11_960, "tokeniser": 2_496}


def one(name: str, steps: int) -> dict:
    """One fit at the defaults with the loop; what it started from, kept, and the run's rate."""
    import torch
    from _cpu_pipelines import PIPELINES, Pipeline, trainer

    import lightning_dataperf
    from lightning_dataperf import OnlineTuning

    warnings.filterwarnings("ignore")
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    module = Pipeline(name, None, autotune=OnlineTuning())
    began = time.perf_counter()
    trainer([], max_steps=steps, max_epochs=-1).fit(PIPELINES[name]["model"](), datamodule=module)
    wall, result = time.perf_counter() - began, module.online_result
    return {
        "wall_s": wall,
        "run_rate": steps / wall,
        "start": result.start.setting.short() if result and result.start else None,
        "kept": result.kept.setting.short() if result and result.kept else None,
        "kept_rate": result.kept.steps_per_sec if result and result.kept else None,
        "load": os.getloadavg()[0],
        "package": lightning_dataperf.__file__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", nargs="+", default=["tiny", "dicts", "io"], choices=sorted(PLANNED))
    parser.add_argument("--runs", type=int, default=2, help="runs of each tree per pipeline")
    parser.add_argument("--trees", nargs="+", default=["."], help="one or two package trees (repository roots)")
    parser.add_argument("--name", default="loop_defaults")
    parser.add_argument("--one", nargs=2, metavar=("PIPELINE", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        # the tree's own benchmarks (whose _common puts that tree's package first), not this file's
        sys.path.remove(HERE)
        sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
        print("RESULT " + json.dumps(one(args.one[0], int(args.one[1]))), flush=True)
        return
    from _common import print_table, write_json

    trees = [os.path.abspath(tree) for tree in args.trees]
    rows = []
    for name in args.pipelines:
        runs: dict[str, list[dict]] = {tree: [] for tree in trees}
        for number in range(args.runs):
            order = trees if number % 2 == 0 else trees[::-1]
            for tree in order:
                command = [sys.executable, os.path.abspath(__file__), "--one", name, str(PLANNED[name])]
                env = {**os.environ, "PYTHONPATH": tree}
                done = subprocess.run(command, check=False, cwd=tree, env=env, capture_output=True, text=True)
                lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                got = json.loads(lines[-1][7:]) if lines else {"error": done.stderr[-2000:]}
                runs[tree].append(got)
                print(name, os.path.basename(tree), got, flush=True)
        rows.append({"pipeline": name, "planned_steps": PLANNED[name], "runs": runs})
        write_json(args.name, {"args": vars(args), "rows": rows})
    table = []
    for row in rows:
        for tree, got in row["runs"].items():
            done = [run for run in got if "error" not in run]
            table.append([
                row["pipeline"], os.path.basename(tree) or tree,
                ", ".join(sorted({str(run["start"]) for run in done})),
                ", ".join(str(run["kept"]) for run in done),
                ", ".join(f"{run['run_rate']:.1f}" for run in done),
                f"{statistics.fmean(run['run_rate'] for run in done):.1f}" if done else "-",
            ])  # fmt: skip
    print_table(["pipeline", "tree", "start", "kept (each run)", "run's steps/s (each)", "mean"], table)


if __name__ == "__main__":
    main()
