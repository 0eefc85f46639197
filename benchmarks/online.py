"""The closed loop (``TunedDataModule(autotune="online")``) and loadtune against a grid measured in the same run,
on CPU pipelines whose steps compute for real (``_cpu_pipelines.py``).

    PYTHONPATH=$PWD python benchmarks/online.py --name online_2core
    PYTHONPATH=$PWD python benchmarks/online.py --pipelines quickstart fft --reps 3 --online-seconds 90
    PYTHONPATH=$PWD python benchmarks/online.py --pipelines tokeniser --runs 5 --online-seconds 10 60 --no-loadtune
    PYTHONPATH=$PWD python benchmarks/online.py --grid-only --no-loadtune --pairs 2

``--runs N``: N loop runs from the same start per ``--online-seconds`` length, each a run planned that long
(``max_steps`` from the start's grid rate, so the cost cap is 5% of it; ``--plan-at best``: from the grid's best
rate, so a run the loop tunes lasts that long); the kept setting's distribution, each
kept setting's share of the grid's best (interleaved pairs), and whether a printed gain was measured to 10%.
``--grid-only``: the grid, and ``TunedDataModule`` at its defaults against its best (no loop runs).

Per pipeline: loadtune 0.3 (``pip install loadtune==0.3.0``; skipped if absent) tunes the same dataset,
model and step in its own runs, and its pick joins the grid; every grid point (workers x intra-op
threads) is a short fit of its own, measured ``--reps`` times in shuffled, interleaved order (steady
steps/s: the first batches after the workers start are left out); then one online fit of
``--online-seconds``; then the loop's and loadtune's picks against the grid's best in ``--pairs`` interleaved
pairs (the best of noisy medians reads high). The verdict's advised change, measured, is ``verdicts.py``'s.
Prints a table and writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import time
import warnings
from typing import Any

import torch
from _common import print_table, write_json
from _cpu_pipelines import (
    OTHERS,
    PIPELINES,
    ROOT_DIR,
    Pipeline,
    StepClock,
    measure,
    measure_default,
    trainer,
    usable_cpus,
)

from lightning_dataperf.autotune.online.records import MEASURED_ERROR

#: The grid's point that is TunedDataModule at its defaults: what it chooses, measured as it chooses it.
DEFAULT = (-1, -1)


def loadtune_pick(name: str, cpus: int) -> tuple[int, int] | None:
    """loadtune's recommendation for the pipeline (its trials run the same step in-process): (workers, threads)."""
    try:
        from loadtune import tune
        from loadtune.workload import Workload
    except ImportError:
        return None
    spec = PIPELINES[name]

    def step(model: Any, optimizer: Any, batch: Any, device: Any) -> torch.Tensor:
        loss = model.training_step(batch, 0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    workload = Workload(
        name=name,
        make_dataset=lambda: spec["data"](200_000),
        make_model=spec["model"],
        train_step=step,
        make_optimizer=lambda model: model.configure_optimizers(),
        default_batch_size=spec["batch"],
        collate_fn=spec.get("collate"),
    )
    result = tune(workload, fast=True, verbose=False)
    torch.set_num_threads(cpus)
    if result.best is None:  # no trial beat its baseline: loadtune keeps the baseline's settings
        knobs = result.baseline.knobs
        return knobs["num_workers"], knobs["num_threads"] or cpus
    return result.best.knobs.num_workers, result.best.knobs.num_threads or cpus


def online_run(name: str, threads: int, seconds: float, steps: int | None = None) -> dict[str, Any]:
    """One online fit: ``seconds`` on a clock (planned 1000 epochs), or a run planned as ``steps`` (``max_steps``)."""
    torch.set_num_threads(threads)
    module = Pipeline(name, PIPELINES[name]["start"], autotune="online")
    clock = StepClock(seconds if steps is None else float("inf"), skip=0)
    started = time.perf_counter()
    # epochs enough to outlast the clock: the loop's cost cap is 5% of the planned run, not of one short epoch
    bound = {"max_epochs": 1000} if steps is None else {"max_epochs": -1, "max_steps": steps}
    trainer([clock], **bound).fit(PIPELINES[name]["model"](), datamodule=module)
    result = module.online_result
    if result is None or result.start is None:
        if steps is not None:  # a planned run too short to measure even its start: a row of its own
            return {
                "kept": [PIPELINES[name]["start"], threads, None],
                "start": [PIPELINES[name]["start"], threads],
                "done": False,
                "trials": [],
                "cost_s": 0.0,
                "gain": None,
                "gain_error": 0.0,
                "unconfirmed": None,
                "notes": ["the start was not measured"],
                "search_s": 0.0,
                "run_s": time.perf_counter() - started,
                "summary": "" if result is None else result.summary(),
            }
        raise SystemExit(f"{name}: the online run ended before its first trial; give it more --online-seconds")
    # a fit that ends mid-search keeps the best it measured; a result from before that rule may lack it
    kept = result.kept or result.start
    return {
        "kept": [kept.setting.num_workers, kept.setting.threads, kept.setting.prefetch_factor],
        "start": [result.start.setting.num_workers, result.start.setting.threads],
        "done": result.done,
        "trials": [
            [
                t.setting.num_workers,
                t.setting.threads,
                t.setting.prefetch_factor,
                t.steps_per_sec,
                t.error,
                t.cost_s,
                t.switch_s,
            ]
            for t in result.trials
        ],
        "cost_s": result.cost_s,
        "gain": result.gain,
        "gain_error": result.gain_error,
        "unconfirmed": None if result.unconfirmed is None else result.unconfirmed.setting.short(),
        "notes": list(result.notes),
        "search_s": sum(trial.seconds + trial.switch_s for trial in result.trials),
        "run_s": time.perf_counter() - started,
        "summary": result.summary(),
    }


def load() -> float:
    """The machine's one-minute load average (other processes on a shared machine), beside every result."""
    return os.getloadavg()[0]


def unmeasured_gain(run: dict[str, Any]) -> bool:
    """A gain printed as measured while its error exceeds 10% (the summary must call it a lead)."""
    moved = run["kept"][:2] != run["start"]
    printed = run["gain"] is not None and "a lead, not a gain" not in run["summary"]
    return moved and printed and run["gain_error"] > MEASURED_ERROR


def repeated_runs(name: str, args: argparse.Namespace, median: dict, best: tuple[int, int]) -> list[dict[str, Any]]:
    """``args.runs`` loop runs from the same start for each planned length; the kept settings against the best."""
    cpus, start = usable_cpus(), (PIPELINES[name]["start"], usable_cpus())
    rows = []
    for seconds in args.online_seconds:
        # at the start's rate a run the loop speeds up 2x lasts half as long: --plan-at best plans it as tuned
        steps = max(10, round(seconds * median[best if args.plan_at == "best" else start]))
        runs = []
        for _ in range(args.runs):
            run = online_run(name, cpus, seconds, steps)
            run["load"] = load()
            runs.append(run)
        torch.set_num_threads(cpus)
        # the loop's own first look at the start against the grid's: far apart, the grid (and so each run's
        # planned length) read a machine busy with something else
        loop_start = statistics.median(run["trials"][0][3] for run in runs if run["trials"])
        if abs(loop_start / median[start] - 1) > 0.25:
            print(
                f"WARNING {name}: the loop read its start at {loop_start:.1f} steps/s, the grid at"
                f" {median[start]:.1f}: the runs were not planned at {seconds:g} s; measure again on a quiet machine"
            )
        kept = [(run["kept"][0], run["kept"][1]) for run in runs]
        # the kept settings and the grid's best side by side in the same rounds: ratios taken within a round
        rounds = in_rounds(name, sorted(set(kept) | {best}), args)
        of_best = {pick: ratio(rounds, pick, best) for pick in set(kept)}
        modal = max(set(kept), key=lambda pick: (kept.count(pick), of_best[pick][0]))
        of_modal = {pick: ratio(rounds, pick, modal) for pick in set(kept)}
        rows.append(
            {
                "seconds": seconds,
                "steps": steps,
                "plan_at": args.plan_at,
                "loop_start_rate": loop_start,
                "runs": runs,
                "kept": {f"{w}w{t}t": kept.count((w, t)) for w, t in sorted(set(kept))},
                "rounds": {f"{w}w{t}t": rates for (w, t), rates in rounds.items()},
                "of_best_pairs": {f"{w}w{t}t": of_best[(w, t)][0] for w, t in of_best},
                "of_best_spread": {f"{w}w{t}t": of_best[(w, t)][1] for w, t in of_best},
                # the target: the modal pick, or one within 3% of it (measured against it in the same rounds)
                "modal": f"{modal[0]}w{modal[1]}t",
                "of_modal": {f"{w}w{t}t": of_modal[(w, t)] for w, t in of_modal},
                "within_3pct_of_modal": sum(abs(of_modal[pick][0] - 1) <= 0.03 for pick in kept),
                # and where the rounds' own spread cannot tell 3% (its ratio's half-range above 3%)
                "within_3pct_unresolved": sum(
                    abs(of_modal[pick][0] - 1) <= 0.03 < of_modal[pick][1] for pick in kept if pick != modal
                ),
                # a gain printed without "not measured to 10%" must have its error within 10%
                "unmeasured_gain_printed": sum(1 for run in runs if unmeasured_gain(run)),
                "load_after": load(),
            }
        )
    return rows


def run_pipeline(name: str, args: argparse.Namespace) -> dict[str, Any]:
    cpus, measured_before = usable_cpus(), len(OTHERS)
    peer = None if args.no_loadtune else loadtune_pick(name, cpus)
    load_before = load()
    # the online loop may go up to 2 x cpus workers: the grid covers what it can keep, and the peer's pick
    grid = {(w, t) for w in range(0, 2 * cpus + 1) for t in sorted({1, cpus})} | ({peer} if peer else set())
    rates: dict[tuple[int, int], list[float]] = {point: [] for point in [*sorted(grid), DEFAULT]}
    policies = set()
    for _ in range(args.reps):
        # TunedDataModule at its defaults (what it chooses may depend on what it measures) among the grid's points
        for point in random.sample([*sorted(grid), DEFAULT], len(grid) + 1):
            if point == DEFAULT:
                rate, chosen = measure_default(name, args.seconds)
                policies.add(chosen)
            else:
                rate = measure(name, *point, args.seconds)
            rates[point].append(rate)
    median = {point: statistics.median(values) for point, values in rates.items()}
    best = max((point for point in median if point != DEFAULT), key=median.get)
    policy = min(policies)
    start = (PIPELINES[name]["start"], cpus)
    # the grid's figures, the same in both kinds of row
    row = {
        "pipeline": name,
        "grid": {f"{w}w{t}t": values for (w, t), values in rates.items()},
        "best": list(best),
        "best_rate": median[best],
        "start": list(start),
        "start_rate": median[start],
        "policy": list(policy),
        "policies": sorted(list(chosen) for chosen in policies),
        "policy_of_best": median[DEFAULT] / median[best],
    }
    if args.grid_only:
        pairs = against_best(name, DEFAULT, best, args)
        return {**row, "policy_pairs": pairs, "policy_of_best_pairs": statistics.median(pairs), "load": load()}
    if args.runs:
        repeated = repeated_runs(name, args, median, best)
        return {
            **row,
            "repeated": repeated,
            "load_before": load_before,
            "others_cores_max": max(OTHERS[measured_before:]),
        }
    online = online_run(name, cpus, args.online_seconds[0])
    kept = (online["kept"][0], online["kept"][1])
    torch.set_num_threads(cpus)
    # the grid's best is the top of noisy medians: the picks are measured against it again, in interleaved pairs
    pairs = {pick: against_best(name, pick, best, args) for pick in {kept, peer} if pick is not None}
    return {
        **row,
        "loadtune": None if peer is None else list(peer),
        "loadtune_of_best": None if peer is None else median[peer] / median[best],
        "online": online,
        "online_of_best": median.get(kept, float("nan")) / median[best],
        "online_pairs": pairs[kept],
        "online_of_best_pairs": statistics.median(pairs[kept]),
        "loadtune_pairs": None if peer is None else pairs[peer],
        "loadtune_of_best_pairs": None if peer is None else statistics.median(pairs[peer]),
        "online_cost_of_5min": online["cost_s"] / 300.0,
        "others_cores_max": max(OTHERS[measured_before:]),
    }


def in_rounds(name: str, picks: list[tuple[int, int]], args: argparse.Namespace) -> dict[tuple[int, int], list]:
    """Each pick's rate in ``args.pairs`` rounds, every round measuring each once (order rotated and reversed)."""
    rates: dict[tuple[int, int], list[float]] = {pick: [] for pick in picks}
    for turn in range(args.pairs if len(picks) > 1 else 0):
        order = picks[turn % len(picks) :] + picks[: turn % len(picks)]
        for pick in order[::-1] if turn % 2 else order:
            rates[pick].append(rate_of(name, pick, args.pair_seconds or args.seconds))
    return rates


def ratio(rounds: dict[tuple[int, int], list[float]], pick: tuple[int, int], against: tuple[int, int]) -> list:
    """``pick``'s rate over ``against``'s: the median of the rounds' ratios and half their range."""
    if pick == against or not rounds[pick]:
        return [1.0, 0.0]
    ratios = [mine / theirs for mine, theirs in zip(rounds[pick], rounds[against], strict=True)]
    return [statistics.median(ratios), (max(ratios) - min(ratios)) / 2]


def against_best(name: str, pick: tuple[int, int], best: tuple[int, int], args: argparse.Namespace) -> list[float]:
    """``pick``'s rate over ``best``'s in ``args.pairs`` interleaved pairs (1.0 each where they are the same)."""
    ratios = []
    for pair in range(args.pairs if pick != best else 0):
        order = [pick, best] if pair % 2 == 0 else [best, pick]
        got = {point: rate_of(name, point, args.pair_seconds or args.seconds) for point in order}
        ratios.append(got[pick] / got[best])
    return ratios or [1.0]


def rate_of(name: str, point: tuple[int, int], seconds: float) -> float:
    return measure_default(name, seconds)[0] if point == DEFAULT else measure(name, *point, seconds)


def setting(point: list[int] | None) -> str:
    return "-" if point is None else f"{point[0]}w {point[1]}t"


def share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def print_repeated(rows: list[dict[str, Any]]) -> None:
    headers = ["pipeline", "planned", "start", "grid best", "start of best", "policy of best", "kept (of runs)"]
    headers += ["kept of best (rounds)", "kept of the modal pick", "within 3% of the modal pick"]
    headers += ["unmeasured gain printed", "load"]
    table = []
    for row in rows:
        for length in row["repeated"]:
            loads = [run["load"] for run in length["runs"]]
            table.append(
                [
                    row["pipeline"],
                    f"{length['seconds']:.0f} s ({length['steps']} steps)",
                    setting(row["start"]),
                    setting(row["best"]),
                    share(row["start_rate"] / row["best_rate"]),
                    share(row["policy_of_best"]),
                    ", ".join(f"{point} x{count}" for point, count in length["kept"].items()),
                    ", ".join(f"{point} {share(value)}" for point, value in length["of_best_pairs"].items()),
                    ", ".join(
                        f"{point} {share(value)} ±{100 * spread:.1f}%"
                        for point, (value, spread) in length.get("of_modal", {}).items()
                    ),
                    within(length),
                    length["unmeasured_gain_printed"],
                    f"{min(loads):.1f}-{max(loads):.1f}",
                ]
            )
    print_table(headers, table)


def within(length: dict[str, Any]) -> str:
    unresolved = length.get("within_3pct_unresolved")
    said = f"{length['within_3pct_of_modal']} of {len(length['runs'])}"
    return said + (f" ({unresolved} of them within the rounds' spread only)" if unresolved else "")


def print_defaults(rows: list[dict[str, Any]]) -> None:
    headers = ["pipeline", "grid best, steps/s", "defaults chose", "defaults of best (grid)", "of best (pairs)", "load"]
    table = [
        [
            row["pipeline"],
            f"{setting(row['best'])}, {row['best_rate']:.1f}",
            ", ".join(setting(chosen) for chosen in row["policies"]),
            share(row["policy_of_best"]),
            ", ".join(share(value) for value in row["policy_pairs"]),
            f"{row['load']:.1f}",
        ]
        for row in rows
    ]
    print_table(headers, table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", nargs="+", default=list(PIPELINES), choices=list(PIPELINES))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0, help="steady seconds per grid measurement")
    parser.add_argument("--online-seconds", type=float, nargs="+", default=[120.0])
    parser.add_argument("--runs", type=int, default=0, help="loop runs per length, each planned that long")
    parser.add_argument("--plan-at", choices=["start", "best"], default="start", help="the rate runs are planned at")
    parser.add_argument("--no-loadtune", action="store_true", help="leave loadtune out")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs of each pick against the grid's best")
    parser.add_argument("--pair-seconds", type=float, default=None, help="seconds per pair or round measurement")
    parser.add_argument("--grid-only", action="store_true", help="the grid and the defaults against its best only")
    parser.add_argument("--name", default="online")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    random.seed(0)
    rows = []
    for name in args.pipelines:
        rows.append(run_pipeline(name, args))
        write_json(args.name, {"args": vars(args), "rows": rows})
    if args.grid_only:
        print_defaults(rows)
        shutil.rmtree(ROOT_DIR, ignore_errors=True)
        return
    if args.runs:
        print_repeated(rows)
        write_json(args.name, {"args": vars(args), "rows": rows})
        shutil.rmtree(ROOT_DIR, ignore_errors=True)
        return
    headers = ["pipeline", "start", "grid best", "start of best", "policy", "of best", "loadtune", "of best"]
    headers += ["online kept", "of best", "trials", "cost s", "cost of 5 min", "others' cores"]
    print_table(
        headers,
        [
            [
                row["pipeline"],
                setting(row["start"]),
                setting(row["best"]),
                share(row["start_rate"] / row["best_rate"]),
                setting(row["policy"]),
                share(row["policy_of_best"]),
                setting(row["loadtune"]),
                share(row["loadtune_of_best_pairs"]),
                setting(row["online"]["kept"][:2]),
                share(row["online_of_best_pairs"]),
                len(row["online"]["trials"]),
                f"{row['online']['cost_s']:.1f}",
                share(row["online_cost_of_5min"]),
                f"{row['others_cores_max']:.2f}",
            ]
            for row in rows
        ],
    )
    write_json(args.name, {"args": vars(args), "rows": rows})
    shutil.rmtree(ROOT_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
