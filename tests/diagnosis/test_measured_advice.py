"""Advice says what was measured and what is an estimate; contention on the CPU is named (issue 37)."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest
from evidence_fakes import INPUT_BOUND, inside, summary, timing

from lightning_dataperf.diagnosis.diagnose import diagnose
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.telemetry.sources import ProcessSource
from lightning_dataperf.telemetry.stats import SystemStats

MEASURED = (
    "online tuning kept num_workers=2, prefetch_factor=2, pin_memory=False, threads=1: 30.0 steps/s, 1.78x the"
    " start's 16.9 steps/s (measured on this run's steps, 9 trials in 20.0 s; cost 1.2 s; ...)"
)


def test_no_estimate_exceeds_the_ceiling_printed_beside_it():
    measured = dataclasses.replace(INPUT_BOUND, loader=inside(None, workers=0, fetch=0.028, collate=0.002))
    verdict = diagnose(Evidence(measured, LoaderFacts(num_workers=0), usable_cpus=8))
    finding = verdict.findings[0]
    assert f"ceiling speed-up if removed: {finding.ceiling_speedup:.2f}x" in verdict.format()
    assert f"up to {finding.ceiling_speedup:.2f}x" in finding.advice[0], "capped at the ceiling (2.78x unbounded)"


def test_a_setting_the_online_loop_measured_is_quoted_instead_of_an_estimate():
    measured = dataclasses.replace(INPUT_BOUND, loader=inside(None, workers=0, fetch=0.028, collate=0.002))
    evidence = Evidence(measured, LoaderFacts(num_workers=0), usable_cpus=8, measured_online=MEASURED)
    advice = diagnose(evidence).findings[0].advice
    assert advice[0] == MEASURED
    assert not any("estimate" in line or "num_workers=" in line for line in advice[1:]), advice


def test_contention_for_the_cores_is_named_on_a_cpu_run():
    system = SystemStats(main_runqueue_percent=60.0, cpu_busy_percent_mean=100.0)
    compute_bound = summary(stall=0.02, DataLoading=0.001, Transfer=0.0, Compute=0.080, Step=0.083)
    evidence = Evidence(compute_bound, LoaderFacts(num_workers=2), system, usable_cpus=2, intra_op_threads=2)
    advice = " ".join(diagnose(evidence).findings[0].advice)
    # 60% of a core waiting over an 83-ms step: about 50 ms per step spent runnable without a core
    assert "together waited 49.8 ms per 83.0-ms step for a core" in advice
    assert "(2 worker processes and 2 intra-op threads share 2 cores)" in advice
    assert "mixed precision" not in advice, "bf16 measured slower on a CPU: not advised there"
    assert "TunedDataModule(autotune=OnlineTuning()) measures both" in advice
    # a run that has the loop already is not sent to it again: told why it may not have tried them
    looped = dataclasses.replace(evidence, measured_online=MEASURED)
    advice = " ".join(diagnose(looped).findings[0].advice)
    assert "the online loop tries both while its cost cap allows" in advice
    assert "TunedDataModule(autotune=OnlineTuning()) measures both" not in advice


def test_a_quiet_cpu_run_and_a_cuda_run_get_no_contention_words():
    quiet = SystemStats(main_runqueue_percent=2.0)
    compute_bound = summary(stall=0.02, DataLoading=0.001, Transfer=0.0, Compute=0.080, Step=0.083)
    assert "contention" not in " ".join(diagnose(Evidence(compute_bound, system=quiet)).findings[0].advice)
    on_gpu = summary(on_device=True, stall=0.02, DataLoading=0.001, Transfer=0.0, Compute=0.080, Step=0.083)
    busy = SystemStats(main_runqueue_percent=60.0)
    advice = " ".join(diagnose(Evidence(on_gpu, system=busy)).findings[0].advice)
    assert "contention" not in advice and "mixed precision" in advice


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux /proc")
def test_the_process_source_reads_every_threads_wait_for_a_core():
    source = ProcessSource()
    source.read(0.1)
    stop = threading.Event()
    spinners = [threading.Thread(target=lambda: stop.wait(0.3)) for _ in range(2)]
    for spinner in spinners:
        spinner.start()
    reading = source.read(0.3)
    stop.set()
    for spinner in spinners:
        spinner.join()
    assert reading["main_threads"] >= 3, "the spinning threads are counted"
    assert reading["main_runqueue_percent"] >= 0.0


def test_advice_to_start_workers_on_a_cpu_run_leaves_them_the_cores_the_threads_held():
    measured = dataclasses.replace(INPUT_BOUND, loader=inside(None, workers=0, fetch=0.028, collate=0.002))
    on_two = Evidence(measured, LoaderFacts(num_workers=0), usable_cpus=2, intra_op_threads=2)
    # 30 ms of loading next to 18 of compute wants 3 workers; 2 cores hold 2, and one intra-op thread beside them
    assert "set num_workers=2 and torch.set_num_threads(1) (now 2" in diagnose(on_two).findings[0].advice[0]
    roomy = Evidence(measured, LoaderFacts(num_workers=0), usable_cpus=8, intra_op_threads=2)
    assert "set_num_threads" not in diagnose(roomy).findings[0].advice[0], "2 threads and 3 workers fit 8 cores"
    # the policy's count (1 worker on 2 cores) read 1.00x on the quickstart: a CPU run is not pointed to it
    assert not any("TunedDataModule picks num_workers" in line for line in diagnose(on_two).findings[0].advice)


def test_loading_cheaper_than_a_hand_over_gets_no_worker_count_at_num_workers_0():
    cheap = dataclasses.replace(
        summary(stall=0.3, DataLoading=0.0012, Transfer=0.0, Compute=0.0028, Step=0.004),
        loader=inside(None, workers=0, fetch=0.001, collate=0.0002),
    )
    advice = diagnose(Evidence(cheap, LoaderFacts(num_workers=0), usable_cpus=2)).findings[0].advice
    assert "about what a worker process's hand-over of it costs" in advice[0] and "num_workers=" not in advice[0]
    # the policy would start a worker too: not pointed to where a worker may well be slower
    assert not any("TunedDataModule picks num_workers" in line for line in advice), advice


def test_spent_cpus_held_by_intra_op_threads_are_given_to_the_workers():
    # issue 37's FFT pipeline: 1 worker 99% busy beside 2 intra-op threads on 2 cores ("more workers cannot help")
    spent = SystemStats(cpu_busy_percent_mean=99.0, main_cpu_percent=95.0, workers_cpu_percent=96.0, runnable_tasks=2.2)
    busy = dataclasses.replace(INPUT_BOUND, loader=inside(0.99, workers=1))
    evidence = Evidence(busy, LoaderFacts(num_workers=1), spent, usable_cpus=2, intra_op_threads=2)
    finding = diagnose(evidence).findings[0]
    advice = " ".join(finding.advice)
    assert finding.kind == "input_bound_cpu"
    assert "2 of them by this process's intra-op threads: set num_workers=2 and torch.set_num_threads(1)" in advice
    assert "more workers cannot help" not in advice
    # 50 ms steps at twice the workers' throughput -> 25 ms, floored at 18 ms of compute on 2 threads, 36 on one
    assert "an estimate from this epoch: up to 1.39x, 50.0 -> 36.0 ms" in advice, advice
    one_thread = Evidence(busy, LoaderFacts(num_workers=1), spent, usable_cpus=2, intra_op_threads=1)
    assert "more workers cannot help" in " ".join(diagnose(one_thread).findings[0].advice)


def test_on_a_cpu_run_the_estimate_for_first_workers_counts_the_cores_they_share_with_the_step():
    measured = dataclasses.replace(INPUT_BOUND, loader=inside(None, workers=0, fetch=0.028, collate=0.002))
    on_two = Evidence(measured, LoaderFacts(num_workers=0), usable_cpus=2, intra_op_threads=1)
    # 30 ms of loading and 18 of compute per batch on 2 cores: at best 24 ms a step, not the 18 of compute
    assert "an estimate from this epoch: up to 2.08x, 50.0 -> 24.0 ms" in diagnose(on_two).findings[0].advice[0]
    # ... and where the advice also cuts 2 intra-op threads to 1, the compute may take twice as long: 36 ms
    two_threads = dataclasses.replace(on_two, intra_op_threads=2)
    assert "up to 1.39x, 50.0 -> 36.0 ms" in diagnose(two_threads).findings[0].advice[0]
    on_gpu = dataclasses.replace(measured, on_device=True, timings={**measured.timings, "DeviceIdle": timing(0.03)})
    advice = diagnose(Evidence(on_gpu, LoaderFacts(num_workers=0), usable_cpus=4)).findings[0].advice[0]
    assert "up to 2.50x" in advice, "the step runs on the GPU: the workers' loading does not share its cores"
