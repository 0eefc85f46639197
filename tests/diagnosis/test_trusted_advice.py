"""Advice that cannot slow a run: no estimate below 1.0x, a contention headline where the step mostly waits for a
core, and the verdict's first workers the online loop's first trial (issue 49)."""

from __future__ import annotations

import dataclasses
import re

from evidence_fakes import inside, summary

from lightning_dataperf.autotune.online import OnlineLoop, Setting, SettingSpace
from lightning_dataperf.diagnosis.diagnose import diagnose
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.telemetry.stats import SystemStats

#: The tokeniser pipeline's shape (issue 49): 0 workers, 2 threads on 2 cores, loading a third of an 88-ms step.
TOKENISER = summary(stall=0.33, DataLoading=0.029, Transfer=0.0, Compute=0.059, Step=0.088)


def _tokeniser(threads: int = 2) -> Evidence:
    measured = dataclasses.replace(TOKENISER, loader=inside(None, workers=0, fetch=0.027, collate=0.002))
    return Evidence(measured, LoaderFacts(num_workers=0), usable_cpus=2, intra_op_threads=threads)


def _estimates(text: str) -> list[float]:
    return [float(value) for value in re.findall(r"up to (\d+\.\d+)x", text)]


def test_an_advised_change_never_prints_an_estimate_below_one():
    # compute beside one thread bounded at twice 59 ms: the old model printed "up to 0.77x" for its own advice
    advice = " ".join(diagnose(_tokeniser()).findings[0].advice)
    assert all(gain >= 1.0 for gain in _estimates(advice)), advice
    assert "no change is advised from this epoch" in advice and "set num_workers=2" in advice
    assert "measure it on your steps: TunedDataModule(autotune=OnlineTuning())" in advice
    # where the model predicts a gain, the change is advised with it as before
    roomy = dataclasses.replace(_tokeniser(threads=1), usable_cpus=4)
    advice = " ".join(diagnose(roomy).findings[0].advice)
    assert "no change is advised" not in advice and _estimates(advice) and min(_estimates(advice)) >= 1.0


def test_every_advised_estimate_across_the_cpu_shapes_is_at_least_one():
    for cpus in (1, 2, 4, 8):
        for threads in (1, 2, 4):
            for fetch, compute in ((0.005, 0.08), (0.027, 0.059), (0.2, 0.01)):
                measured = dataclasses.replace(
                    summary(stall=0.4, DataLoading=fetch, Transfer=0.0, Compute=compute, Step=fetch + compute),
                    loader=inside(None, workers=0, fetch=fetch, collate=0.0),
                )
                evidence = Evidence(measured, LoaderFacts(num_workers=0), usable_cpus=cpus, intra_op_threads=threads)
                text = diagnose(evidence).format()
                assert all(gain >= 1.0 for gain in _estimates(text)), (cpus, threads, fetch, text)


def test_a_step_that_mostly_waits_for_a_core_is_headed_contention_not_compute():
    # under another process's load: 752 of a 756-ms step runnable without a core
    system = SystemStats(main_runqueue_percent=99.5, cpu_busy_percent_mean=100.0)
    busy = summary(stall=0.01, DataLoading=0.001, Transfer=0.0, Compute=0.750, Step=0.756)
    verdict = diagnose(Evidence(busy, LoaderFacts(num_workers=0), system, usable_cpus=2, intra_op_threads=2))
    headline = verdict.findings[0].headline
    assert headline.startswith("contention:") and "752 ms of each 756-ms step" in headline, headline
    assert "speed up the model" not in headline
    # a tenth of the step waiting is named in the advice, but the step is still the model's
    light = SystemStats(main_runqueue_percent=15.0)
    verdict = diagnose(Evidence(busy, LoaderFacts(num_workers=0), light, usable_cpus=2, intra_op_threads=2))
    assert verdict.findings[0].headline.startswith("compute-bound")
    assert "contention, measured" in " ".join(verdict.findings[0].advice)


def test_the_verdicts_first_workers_are_the_loops_first_trial():
    # the quickstart's shape: 30 ms of loading next to 18 of compute at 0 workers, 2 threads on 2 cores
    evidence = Evidence(
        dataclasses.replace(
            summary(stall=0.6, DataLoading=0.030, Transfer=0.0, Compute=0.018, Step=0.048),
            loader=inside(None, workers=0, fetch=0.028, collate=0.002),
        ),
        LoaderFacts(num_workers=0),
        usable_cpus=2,
        intra_op_threads=2,
    )
    advice = diagnose(evidence).findings[0].advice[0]
    assert "set num_workers=2 and torch.set_num_threads(1)" in advice, advice
    start = Setting(0, None, False, 2)
    loop = OnlineLoop(start, SettingSpace(4, 2, True, False), min_seconds=0.0, planned=lambda: 1e6)
    now = 0.0
    for _ in range(40):
        loop.fetched(0.030)
        setting = loop.step(now)
        now += 0.048
        if setting is not None:
            break
    assert setting == Setting(2, 2, False, 1), setting
