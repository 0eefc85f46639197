"""The GPU-decode path seen by DataPerfCallback: Decode/... logged per window, the epoch's DecodeStats in the
summary, and a verdict that says whether the engines, the decode call, the decode thread, its GPU work or the
workers bind."""

from __future__ import annotations

import dataclasses
import math

import lightning.pytorch as pl
import pytest
import torch
from helpers import trainer_kwargs, write_files
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback, GpuDecodeOptions
from lightning_dataperf.decode.stats import DecodeStats
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.rules.decode import gpu_decode_cause
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.timing.summary import EpochSummary, TimingSummary


def test_a_window_is_the_difference_of_two_snapshots():
    before = DecodeStats(batches=10, images=1280, decode_seconds=0.05, wait_seconds=0.01, lookahead_mean=2.0, takes=10)
    now = DecodeStats(batches=30, images=3840, decode_seconds=0.25, wait_seconds=0.05, lookahead_mean=1.0, takes=30)
    window = now.since(before)
    assert (window.batches, window.images, window.takes) == (20, 2560, 20)
    assert window.decode_seconds == pytest.approx(0.20) and window.wait_per_take == pytest.approx(0.002)
    assert window.lookahead_mean == pytest.approx((30 * 1.0 - 10 * 2.0) / 20)  # 0.5 batches ready in the window
    metrics = window.to_metrics()
    assert metrics["Decode/batch_seconds"] == pytest.approx(0.01) and "Decode/jpeg_util_percent" not in metrics
    summary = _evidence(window).summary
    assert EpochSummary.from_dict(summary.to_dict()) == summary  # the summaries file's round trip


def _evidence(decode: DecodeStats, step_s: float = 0.0106, workers: int = 4) -> Evidence:
    timing = TimingSummary(step_s, step_s, step_s, step_s, step_s, 100)
    summary = EpochSummary(
        stage="train",
        epoch=0,
        steps=100,
        timings={"DataLoading": timing, "Step": timing},
        input_stall_fraction=0.4,
        data_wait_share=0.4,
        samples_per_sec=7000.0,
        epoch_start=0.1,
        decode=decode,
    )
    return Evidence(summary, LoaderFacts(num_workers=workers))


def test_the_verdict_names_what_binds_on_the_gpu_decode_path():
    base = DecodeStats(batches=100, takes=100, wait_seconds=0.4, lookahead_mean=0.3, backend="torchvision")
    thread = dataclasses.replace(base, submit_seconds=1.9, submit_cpu_seconds=1.2, decode_seconds=0.9)
    kind, words, advice = gpu_decode_cause(_evidence(thread), thread)
    assert kind == "input_bound_decode" and words == "GPU decode, the decode thread's submission", advice
    assert "19.0 ms per batch (12.0 ms of its own CPU" in advice[0] and "JPEG engines are not measured" in advice[0]
    engine = dataclasses.replace(thread, jpeg_util_percent=93.0)
    assert gpu_decode_cause(_evidence(engine), engine)[1] == "GPU decode, the JPEG engines are busy"
    fast = dataclasses.replace(base, submit_seconds=0.3, submit_cpu_seconds=0.2, decode_seconds=0.2)
    idle = dataclasses.replace(_evidence(fast), system=SystemStats(cpu_busy_percent_mean=50.0), usable_cpus=16)
    kind, words, advice = gpu_decode_cause(idle, fast)
    assert (
        kind == "input_bound_workers"
        and "about 8 cores are idle: raise the wrapped loader's num_workers (now 4)" in advice[0]
    )
    busy = dataclasses.replace(idle, system=SystemStats(cpu_busy_percent_mean=99.0))
    assert "no core is idle" in gpu_decode_cause(busy, fast)[2][0]
    assert "idle cores were not measured this epoch" in gpu_decode_cause(_evidence(fast), fast)[2][0]
    assert gpu_decode_cause(_evidence(fast, step_s=0.0), fast)[0] == "input_bound_unknown"
    cpu = dataclasses.replace(thread, backend="pil")
    assert gpu_decode_cause(_evidence(cpu), cpu)[1] == "decode on the CPU (no CUDA device)"


def test_a_decode_call_slower_than_the_step_is_named_not_the_workers():
    # a compiled ResNet-18 step (7.8 ms) beside torchvision's call thread: 13 ms per call, the decode thread 4 ms
    compiled = DecodeStats(
        batches=100, takes=100, wait_seconds=0.5, lookahead_mean=0.3, backend="torchvision", submit_seconds=0.4,
        submit_cpu_seconds=0.2, decode_seconds=0.3, call_seconds=1.3,
    )  # fmt: skip
    kind, words, advice = gpu_decode_cause(_evidence(compiled, step_s=0.0078), compiled)
    assert kind == "input_bound_decode" and words == "GPU decode, the decode library's call"
    assert "13.0 ms per batch for a 7.8 ms step (the JPEG engines not measured)" in advice[0]
    assert "wait behind the step's work" in advice[0] and "num_workers" not in advice[0]
    # the decode thread slower than the call: the thread is named, as before
    thread = dataclasses.replace(compiled, submit_seconds=1.9, submit_cpu_seconds=1.2)
    assert gpu_decode_cause(_evidence(thread, step_s=0.0078), thread)[1] == "GPU decode, the decode thread's submission"


class TinyNet(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 5)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1).float()), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_a_trainer_on_a_gpu_decode_loader_logs_decode_figures_and_judges_them(tmp_path):
    pytest.importorskip("PIL")
    from lightning_dataperf.decode import GpuDecodeLoader
    from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

    dataset = EncodedImageDataset(write_files(str(tmp_path / "images"), 48), seed=0)
    loader = GpuDecodeLoader(DataLoader(dataset, batch_size=4, collate_fn=collate_encoded), device="cpu", size=8)
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    logger = pl.loggers.CSVLogger(str(tmp_path))
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], logger=logger, log_every_n_steps=4, **trainer_kwargs(tmp_path))
    trainer.fit(TinyNet(), loader)
    decode = perf.last_summary.decode
    assert decode is not None and decode.batches == 12 and decode.images == 48 and decode.backend == "pil"
    assert decode.takes == 12 and not math.isnan(decode.wait_per_take)
    logged = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "Decode/batch_seconds" in logged and "Decode/lookahead_mean" in logged
    assert "decode path (pil): 12 batches" in perf.last_summary.format()


def test_tuned_datamodule_gpu_decode_is_one_switch(tmp_path):
    """``TunedDataModule(gpu_decode=...)``: the loader over encoded JPEGs gets the collate, few workers, the wrap."""
    pytest.importorskip("PIL")
    from lightning_dataperf import TunedDataModule
    from lightning_dataperf.decode import GpuDecodeLoader
    from lightning_dataperf.decode.encoded import EncodedImageDataset

    samples = write_files(str(tmp_path / "images"), 24)

    class Images(TunedDataModule):
        def train_dataloader(self):
            return DataLoader(EncodedImageDataset(samples, seed=0), batch_size=4, shuffle=True)

    class Checked(TinyNet):
        shapes: list = []

        def training_step(self, batch, batch_idx):
            images, labels = batch
            Checked.shapes.append((tuple(images.shape), images.device.type, labels.dtype))
            return super().training_step(batch, batch_idx)

    # the deprecated spelling (kept for one release) is GpuDecodeOptions(size=8), and decodes the same way
    with pytest.warns(DeprecationWarning, match=r"gpu_decode=GpuDecodeOptions\(size=8\)"):
        data = Images(seed=0, gpu_decode={"size": 8}, verbose=False)
    assert data.gpu_decode == GpuDecodeOptions(size=8)
    trainer = pl.Trainer(max_epochs=1, logger=False, **trainer_kwargs(tmp_path))
    trainer.fit(Checked(), datamodule=data)
    assert isinstance(trainer.train_dataloader, GpuDecodeLoader) or isinstance(
        getattr(trainer.train_dataloader, "iterables", None), GpuDecodeLoader
    ), type(trainer.train_dataloader)
    assert Checked.shapes == [((4, 3, 8, 8), "cpu", torch.int64)] * 6
    plan = data.loader_plans["train"][0]
    assert plan.chosen["num_workers"] <= 4 and any("GpuDecodeLoader(device=cpu, size=8)" in n for n in plan.notes)


def test_gpu_decode_loader_defaults_cap_the_policy_but_not_a_choice():
    from lightning_dataperf import TunedDataModule
    from lightning_dataperf.decode.encoded import collate_encoded, encoded_loader_defaults

    capped = encoded_loader_defaults({}, policy_workers=15)
    assert capped["num_workers"][0] == 4 and capped["collate_fn"] == (collate_encoded, "")
    assert "num_workers" not in encoded_loader_defaults({"num_workers": 12}, policy_workers=15)  # yours wins
    assert "num_workers" not in encoded_loader_defaults({}, policy_workers=None)  # autotune measured: kept
    assert "collate_fn" not in encoded_loader_defaults({"collate_fn": list}, policy_workers=2)
    assert TunedDataModule(gpu_decode=GpuDecodeOptions()).gpu_decode == GpuDecodeOptions()
    assert TunedDataModule().gpu_decode is None


def test_gpu_decode_datamodule_resumes_mid_epoch_with_the_remaining_batches(tmp_path):
    """Through the GpuDecodeLoader wrapper: Lightning sees a stateful loader (no "not resumable" warning), and
    a run resumed from a mid-epoch checkpoint takes the batches the interrupted run had not taken, with the
    same crops (drawn from seed, epoch and index), although the decode thread had decoded ahead."""
    import warnings

    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_dataperf import TunedDataModule
    from lightning_dataperf.decode.encoded import EncodedImageDataset

    pytest.importorskip("PIL")
    samples = [(path, index) for index, (path, _) in enumerate(write_files(str(tmp_path / "images"), 24))]

    class Images(TunedDataModule):
        def train_dataloader(self):
            return DataLoader(EncodedImageDataset(samples, seed=0), batch_size=4, shuffle=True, num_workers=0)

    class Recording(TinyNet):
        def __init__(self):
            super().__init__()
            self.seen = []

        def training_step(self, batch, batch_idx):
            images, labels = batch
            self.seen.append((self.current_epoch, labels.tolist(), round(float(images.float().sum()), 3)))
            self.loader = self.trainer.train_dataloader
            return super().training_step((images, labels % 5), batch_idx)  # labels: the dataset index here

    def run(root, ckpt_path=None, every=None):
        model = Recording()
        callbacks = [ModelCheckpoint(root / "ckpt", every_n_train_steps=every, save_top_k=-1)] if every else []
        options = trainer_kwargs(root, enable_checkpointing=bool(every))
        trainer = pl.Trainer(max_epochs=2, callbacks=callbacks, logger=False, **options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            datamodule = Images(seed=3, gpu_decode=GpuDecodeOptions(size=8), verbose=False)
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        return model, [str(w.message) for w in caught]

    import inspect

    from lightning_dataperf.decode import GpuDecodeLoader

    wrapped = GpuDecodeLoader(DataLoader(EncodedImageDataset(samples, seed=0)), device="cpu")
    assert inspect.getattr_static(wrapped, "state_dict", None) is None  # a plain DataLoader: not stateful
    full, _ = run(tmp_path / "full", every=1)
    # Lightning's _Stateful check looks the methods up statically (Python >= 3.12): instance attributes
    assert isinstance(full.loader, GpuDecodeLoader), type(full.loader)
    assert callable(inspect.getattr_static(full.loader, "state_dict", None))
    resumed, messages = run(tmp_path / "resumed", ckpt_path=tmp_path / "full" / "ckpt" / "epoch=0-step=2.ckpt")
    assert not [m for m in messages if "not resumable" in m], messages
    assert len(full.seen) == 12 and sorted(i for row in full.seen[:6] for i in row[1]) == list(range(24))
    assert resumed.seen == full.seen[2:], "the remaining batches of epoch 0 (same crops), then epoch 1"


def test_a_decode_on_the_cpu_is_never_said_to_run_on_the_gpu():
    """Issue 47: a CPU run whose decode backend is not PIL (a custom backend object, or a summary that did not
    record it) was judged as GPU decode ("GPU decode, its time on the GPU"); it says where it ran."""
    slow = DecodeStats(batches=100, takes=100, wait_seconds=0.4, lookahead_mean=0.3, decode_seconds=0.9)
    for backend in ("host", ""):
        decode = dataclasses.replace(slow, backend=backend)
        kind, words, advice = gpu_decode_cause(_evidence(decode), decode)  # on_device=False: a CPU run
        text = " ".join([words, *advice])
        assert kind == "input_bound_decode" and words.startswith("decode on the CPU"), words
        assert "GPU decode" not in text and "on the GPU" not in text and "JPEG engines" not in text, text
        assert "run on a GPU" in advice[0]
    assert "(host decode)" in gpu_decode_cause(_evidence(slow), dataclasses.replace(slow, backend="host"))[2][0]
    # the same figures on a CUDA run stay a GPU decode
    gpu_run = dataclasses.replace(_evidence(slow), summary=dataclasses.replace(_evidence(slow).summary, on_device=True))
    assert gpu_decode_cause(gpu_run, slow)[1] == "GPU decode, its time on the GPU"


class _SlowHostBackend:
    """A custom backend object on the CPU: decodes with PIL into the flat buffer's ``hwc`` slots, slowly."""

    name, layout = "host", "hwc"

    def decode(self, data, spans, sizes, flat, bases):
        import io
        import time

        from PIL import Image

        time.sleep(0.03)  # a decode that keeps the tiny step waiting, whatever the machine's load
        for (start, end), base, (h, w) in zip(spans, bases, sizes, strict=True):
            image = Image.open(io.BytesIO(data[start:end].numpy().tobytes())).convert("RGB")
            flat[base : base + 3 * h * w] = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        return [True] * len(spans), None


def test_a_cpu_run_with_a_custom_decode_backend_gets_a_cpu_verdict(tmp_path):
    pytest.importorskip("PIL")
    from lightning_dataperf.decode import GpuDecodeLoader
    from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

    dataset = EncodedImageDataset(write_files(str(tmp_path / "images"), 48), seed=0)
    loader = GpuDecodeLoader(
        DataLoader(dataset, batch_size=4, collate_fn=collate_encoded), device="cpu", size=8, backend=_SlowHostBackend()
    )
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], logger=False, **trainer_kwargs(tmp_path))
    trainer.fit(TinyNet(), loader)
    assert perf.last_summary.decode is not None and perf.last_summary.decode.backend == "host"
    verdict = perf.last_diagnosis.format()
    assert "input-bound (decode on the CPU (host backend))" in verdict, verdict
    assert "GPU decode" not in verdict and "on the GPU" not in verdict, verdict


def test_a_fit_stopped_mid_epoch_leaves_no_decode_thread_running(tmp_path):
    """A fit ended by ``max_steps`` mid-epoch left the epoch's decode and prepare threads running past it (and the
    interpreter aborted at exit inside them): the datamodule's teardown stops them."""
    pytest.importorskip("PIL")
    import threading

    from lightning_dataperf import TunedDataModule
    from lightning_dataperf.decode.encoded import EncodedImageDataset

    samples = write_files(str(tmp_path / "images"), 40)

    class Images(TunedDataModule):
        def train_dataloader(self):
            return DataLoader(EncodedImageDataset(samples, seed=0), batch_size=4, shuffle=True, num_workers=0)

    def decoding() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("dataperf-gpu") and t.is_alive()]

    assert not decoding()
    data = Images(seed=3, gpu_decode=GpuDecodeOptions(size=8), verbose=False)
    trainer = pl.Trainer(max_steps=3, logger=False, **trainer_kwargs(tmp_path))
    trainer.fit(TinyNet(), datamodule=data)
    assert trainer.global_step == 3  # 3 of the epoch's 10 batches: the decode thread was still reading ahead
    assert not decoding(), decoding()
