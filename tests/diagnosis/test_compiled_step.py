"""Issue 46: a verdict that knows how the step runs. A compiled (or CUDA-graph) step is never sent to
torch.compile again; its host gap is put down to what the host was measured doing, with the figures; where the
online loop measured both ends of the split decode, the verdict says which was faster, with the rates."""

from __future__ import annotations

import dataclasses

import lightning.pytorch as pl
import torch
from evidence_fakes import summary
from helpers import SleepyModel, recorded_evidence, sleepy_loader, trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.autotune.online.records import Measured, OnlineResult, Setting
from lightning_dataperf.callback.run_evidence import decode_placement_measured, step_compiled_words
from lightning_dataperf.decode.stats import DecodeStats
from lightning_dataperf.diagnosis.diagnose import diagnose
from lightning_dataperf.diagnosis.evidence import (
    STEP_COMPILED,
    STEP_COMPILED_CUDA_GRAPHS,
    DecodePlacementMeasured,
    Evidence,
)
from lightning_dataperf.diagnosis.rules.compute import compute_bound
from lightning_dataperf.diagnosis.rules.host import host_bound, host_gap
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.timing.host_gap import HostGapStats

#: What an eager step is told; a compiled one must never be.
COMPILE_ADVICE = ("torch.compile or CUDA graphs", "compiling the step would", 'mode="reduce-overhead"')

# A CUDA step of 20 ms span, 12 ms GPU busy: an 8 ms host gap, the training thread on a CPU 40% of the span.
GAP = HostGapStats(steps=8, span_s=0.020, gpu_busy_s=0.012, host_gap_s=0.008, first_step=20, main_cpu_fraction=0.4)
DECODE = DecodeStats(
    batches=100, images=12800, takes=100, wait_seconds=0.05, lookahead_mean=1.5, backend="nvjpeg",
    submit_seconds=0.3, submit_cpu_seconds=0.1, prepare_seconds=0.12, call_seconds=0.6, decode_seconds=0.4,
)  # fmt: skip


def _evidence(compiled: str | None, decode: DecodeStats | None = DECODE, gap: HostGapStats | None = GAP, **more):
    epoch = summary(on_device=True, DataLoading=0.0004, Transfer=0.0, Compute=0.020, Step=0.0205, DeviceIdle=0.0005)
    epoch = dataclasses.replace(epoch, host_gap=gap, decode=decode)
    return Evidence(epoch, LoaderFacts(num_workers=4), step_compiled=compiled, **more)


def _advice(finding) -> str:
    return " | ".join(finding.advice)


def test_an_eager_step_with_a_host_gap_is_told_to_compile():
    finding = host_gap(_evidence(None))
    assert finding is not None and "torch.compile or CUDA graphs" in _advice(finding)


def test_a_compiled_step_with_a_host_gap_is_told_what_occupies_the_host_with_the_figures():
    finding = host_gap(_evidence(STEP_COMPILED_CUDA_GRAPHS))
    assert finding is not None and finding.kind == "host_bound"
    words = _advice(finding)
    assert not any(advice in words for advice in COMPILE_ADVICE), words
    assert "the step is already compiled (torch.compile (CUDA graphs)): compiling again does not remove" in words
    assert "inside each compiled step the GPU waits 39% of the time for the host" in finding.headline
    occupants = [
        "the training thread ran 8.0 ms on a CPU per 20.0-ms profiled step (Python in training_step",
        "the decode library's call 6.0 ms per batch",
        "the decode thread 3.0 ms per batch (1.0 ms its own CPU)",
        "preparing each batch 1.2 ms",
        "the hand-over: the step waited 0.5 ms per batch for decoded images",
    ]
    positions = [words.index(occupant) for occupant in occupants]
    assert positions == sorted(positions), "largest first"
    assert "without the gap a step would take 12.5 ms instead of 20.5 ms" in words
    assert "to shorten the training thread's part: no per-step host syncs" in words and "gpu_share" not in words


def test_where_the_decode_threads_take_the_most_the_remedy_is_a_lower_gpu_share():
    slow = dataclasses.replace(DECODE, call_seconds=1.5)  # the decode call: 15 ms per batch
    words = _advice(host_gap(_evidence(STEP_COMPILED_CUDA_GRAPHS, decode=slow)))
    assert words.index("the decode library's call 15.0 ms per batch") < words.index("the training thread ran 8.0 ms")
    assert "a lower gpu_share moves part of each batch to the loader's workers" in words
    assert "to shorten the training thread's part" not in words


def test_a_compiled_step_without_the_decode_path_names_the_loaders_hand_over():
    finding = host_gap(_evidence(STEP_COMPILED, decode=None))
    words = _advice(finding)
    assert "already compiled (torch.compile)" in words and "torch.compile or CUDA graphs" not in words
    assert "the host waited 0.4 ms per step in the loader's next()" in words
    assert words.index("the training thread ran 8.0 ms") < words.index("the host waited 0.4 ms")


def test_a_compiled_step_idle_between_steps_is_not_told_to_compile():
    # the GPU idles 8 ms between steps while the host waits only 0.4 ms for data: launches and syncs bind
    epoch = summary(on_device=True, DataLoading=0.0004, Transfer=0.0, Compute=0.012, Step=0.020, DeviceIdle=0.008)
    eager = host_bound(Evidence(epoch, LoaderFacts(num_workers=4)))
    assert eager is not None and "torch.compile or CUDA graphs" in _advice(eager)
    compiled = host_bound(Evidence(epoch, LoaderFacts(num_workers=4), step_compiled=STEP_COMPILED))
    words = _advice(compiled)
    assert "torch.compile or CUDA graphs" not in words and "already compiled (torch.compile)" in words
    assert "the host waited 0.4 ms per step in the loader's next()" in words
    # 0.4 ms of a 20 ms step cannot be what holds the host: no remedy for it, and the rest said to be unmeasured
    assert "the batches arrive late" not in words and "none of these takes a tenth of the step" in words


def test_the_compute_bound_advice_leaves_out_compiling_a_compiled_step():
    assert "torch.compile" in _advice(compute_bound(_evidence(None)))
    assert "torch.compile" not in _advice(compute_bound(_evidence(STEP_COMPILED_CUDA_GRAPHS)))


def test_the_whole_verdict_of_a_host_bound_compiled_step():
    verdict = diagnose(_evidence(STEP_COMPILED_CUDA_GRAPHS))
    assert verdict.bottleneck == "host_bound", verdict.format()
    text = verdict.format()
    assert not any(advice in text for advice in COMPILE_ADVICE), text
    assert "the decode library's call 6.0 ms per batch" in text
    eager = diagnose(_evidence(None)).format()
    assert "torch.compile or CUDA graphs" in eager


PLACED = DecodePlacementMeasured(
    cpu_only=48.0, gpu_only=39.0, cpu_only_error=0.02, gpu_only_error=0.02, cpu_only_workers=8, kept_share=0.5,
    kept=52.0,
)  # fmt: skip


def test_the_measured_faster_end_of_the_split_decode_is_named_with_its_rates():
    finding = host_gap(_evidence(STEP_COMPILED_CUDA_GRAPHS, decode_placement=PLACED))
    words = _advice(finding)
    # 128 images a batch: 48 steps/s are 6144 images/s
    assert "the CPU workers alone (gpu_share=0, 8 workers) 48.0 steps/s (6144 images/s)" in words
    assert "the GPU decode alone (gpu_share=1) 39.0 steps/s (4992 images/s)" in words
    assert "the CPU workers decode faster here, 1.23x the GPU decode's rate" in words
    assert "the loop kept gpu_share=0.5 at 52.0 steps/s (6656 images/s)" in words
    reverse = dataclasses.replace(PLACED, cpu_only=30.0, kept_share=None, kept=None)
    words = _advice(host_gap(_evidence(STEP_COMPILED, decode_placement=reverse)))
    assert "the GPU decode is faster here, 1.30x the CPU workers' rate" in words and "kept" not in words
    # 48 against 46 with 5% errors: within twice their combined error, so neither is called faster
    close = dataclasses.replace(PLACED, gpu_only=46.0, cpu_only_error=0.05, gpu_only_error=0.05)
    words = _advice(host_gap(_evidence(STEP_COMPILED, decode_placement=close)))
    assert "the two ends measured the same within their noise" in words and "faster here" not in words


def test_no_placement_words_where_the_loop_did_not_measure_both_ends():
    words = _advice(host_gap(_evidence(STEP_COMPILED)))
    assert "gpu_share=0" not in words and "faster here" not in words


class Holder(pl.LightningModule):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net


def test_the_callback_words_for_how_the_step_runs():
    net = torch.nn.Linear(2, 2)
    assert step_compiled_words(Holder(net)) is None and step_compiled_words(None) is None
    assert step_compiled_words(Holder(torch.compile(net))) == STEP_COMPILED
    assert step_compiled_words(Holder(torch.compile(net, mode="reduce-overhead"))) == STEP_COMPILED_CUDA_GRAPHS


def _trial(share: float | None, rate: float, workers: int = 4, error: float = 0.02) -> Measured:
    return Measured(Setting(workers, 2, True, 1, gpu_share=share), rate, error, batches=40, seconds=40 / rate)


def test_the_online_loops_two_ends_are_read_from_its_trials():
    trials = [_trial(1.0, 39.0), _trial(0.0, 30.0, workers=4), _trial(0.0, 48.0, workers=8), _trial(0.5, 52.0)]
    # cut before two rounds: its rate is no measurement to compare
    trials.append(_trial(0.0, 60.0, workers=12, error=float("inf")))
    result = OnlineResult(start=trials[0], kept=trials[3], trials=trials)
    assert decode_placement_measured(result) == DecodePlacementMeasured(
        cpu_only=48.0, gpu_only=39.0, cpu_only_error=0.02, gpu_only_error=0.02, cpu_only_workers=8, kept_share=0.5,
        kept=52.0,
    )  # fmt: skip
    result.stop_reason = "..."
    assert "decode on the CPU only 48.0 steps/s, on the GPU only 39.0" in result.summary(), "the summary reads the same"
    one_end = OnlineResult(start=trials[0], kept=trials[0], trials=trials[:1] + trials[3:4])
    assert decode_placement_measured(one_end) is None
    unsplit = [Measured(Setting(4, 2, True, 1), 40.0, 0.02, 40, 1.0)]
    assert decode_placement_measured(OnlineResult(start=unsplit[0], kept=unsplit[0], trials=unsplit)) is None
    assert decode_placement_measured(None) is None


def test_a_fit_with_a_compiled_model_gives_the_verdict_a_compiled_step(tmp_path, monkeypatch):
    gathered: list[Evidence] = recorded_evidence(monkeypatch)
    model = SleepyModel()
    # backend="eager": Dynamo traces the step, no C++ compile; found the same way as Inductor's
    model.layer = torch.compile(model.layer, backend="eager")
    trainer = pl.Trainer(max_epochs=1, callbacks=[DataPerfCallback(print_summary=False)], **trainer_kwargs(tmp_path))
    trainer.fit(model, sleepy_loader(48, 4, 0.0))
    assert gathered and all(evidence.step_compiled == STEP_COMPILED for evidence in gathered)
