"""What the tests share: Trainer options, models and data sets with known costs, fakes, runners.

Every test module imports its helpers from here (never from another test module or ``conftest``); the autotune
tests' stand-ins for TrialRunner are in ``autotune/autotune_fakes.py``. Test modules live in folders that mirror
the package (pytest imports them with ``--import-mode=importlib``); ``conftest.py`` puts this folder on sys.path.
"""

from __future__ import annotations

import faulthandler
import io
import os
import random
import subprocess
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import TunedDataModule
from lightning_dataperf.telemetry.hardware import Hardware
from lightning_dataperf.testing import SleepCollate, SleepingLoaderDataset, loopback_ranks

HERE = Path(__file__).parent
ROOT = HERE.parent

#: Set by :func:`run_two_ranks` for its ranks (which import this module): each prints every thread's stack once
#: this many seconds in, so a hung run's failure shows where each rank waited.
DUMP_STACKS_AFTER = "DATAPERF_TEST_DUMP_STACKS_AFTER"
if os.environ.get(DUMP_STACKS_AFTER):
    faulthandler.dump_traceback_later(float(os.environ[DUMP_STACKS_AFTER]), exit=False)


def ddp_kwargs(tmp_path, **overrides):
    """Two-rank DDP options for the torch.distributed.run scripts: gloo on the CPU by default, or NCCL on
    two GPUs with ``DATAPERF_DDP_ACCELERATOR=cuda`` (the multi-GPU validation in benchmarks/README.md)."""
    accelerator = os.environ.get("DATAPERF_DDP_ACCELERATOR", "cpu")
    return trainer_kwargs(tmp_path, accelerator=accelerator, devices=2, strategy="ddp", **overrides)


def trainer_kwargs(tmp_path, **overrides):
    kwargs = dict(
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
        num_sanity_val_steps=0,
    )
    kwargs.update(overrides)
    return kwargs


def run_two_ranks(script: str, out_dir: Path, *args: str, timeout: float = 240.0) -> None:
    """``tests/scripts/<script>`` as two ranks under ``torch.distributed.run``, on this host's loopback only
    (:func:`~lightning_dataperf.testing.loopback_ranks`). A run past ``timeout`` fails with what the ranks had
    printed by then, each rank's stacks included (:data:`DUMP_STACKS_AFTER`, 30 s before ``timeout``)."""
    command, env = loopback_ranks(str(HERE / "scripts" / script), str(out_dir), *args, pythonpath=str(ROOT))
    env[DUMP_STACKS_AFTER] = str(max(1.0, timeout - 30))
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM: the launcher stops its ranks (each in its own session) before it exits; SIGKILL would leave them
            process.terminate()
            try:
                stdout, stderr = process.communicate(timeout=45)  # past the launcher's own 30-s shutdown
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            printed = stdout[-3000:] + stderr[-20000:]  # the ranks' stacks are in their stderr
            raise AssertionError(
                f"{script} {' '.join(args)}: two ranks still running after {timeout:.0f} s\n{printed}"
            ) from None
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]


def fake_hardware(**overrides) -> Hardware:
    values = dict(
        logical_cpus=16,
        physical_cpus=8,
        usable_cpus=16,
        usable_cpus_source="os.cpu_count()",
        local_world_size=1,
        ram_total_mb=64_000,
        ram_available_mb=32_000,
        shm_total_mb=8_000,
        shm_free_mb=8_000,
    )
    values.update(overrides)
    return Hardware(**values)


def scalar_tags(log_dir):
    accumulator = EventAccumulator(log_dir)
    accumulator.Reload()
    return accumulator


def sleepy_loader(length: int, batch_size: int, sleep_s: float, **kwargs) -> DataLoader:
    """``length`` samples of 8 features; each *batch* costs ``sleep_s`` of host time (in the collate)."""
    dataset = SleepingLoaderDataset(length, features=8)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=SleepCollate(sleep_s * 1e3), **kwargs)


class SleepyModel(pl.LightningModule):
    """A linear model whose training/eval steps sleep ``step_s`` on the host."""

    def __init__(self, step_s: float = 0.0, features: int = 8) -> None:
        super().__init__()
        self.step_s = step_s
        self.layer = nn.Linear(features, 1)
        self.seen: list[torch.Tensor] = []

    def _step(self, batch):
        if self.step_s:
            time.sleep(self.step_s)
        return self.layer(batch).pow(2).mean()

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[:, 0].clone())
        return self._step(batch)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return self._step(batch)

    def test_step(self, batch, batch_idx):
        return self._step(batch)

    def predict_step(self, batch, batch_idx):
        return self._step(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class IndexedDataset(Dataset):
    """Sample ``i`` is ``[i, epoch, random draw]``: the index, the epoch the worker knows, an augmentation."""

    def __init__(self, length: int) -> None:
        self.length, self.epoch = length, -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), float(self.epoch), random.random()])


class IndexData(TunedDataModule):
    def __init__(self, length=30, batch_size=4, workers=None, val_length=0, **kwargs):
        super().__init__(**kwargs)
        self.length, self.batch_size, self.workers, self.val_length = length, batch_size, workers, val_length

    def train_dataloader(self):
        options = {} if self.workers is None else {"num_workers": self.workers}
        return DataLoader(IndexedDataset(self.length), batch_size=self.batch_size, shuffle=True, **options)

    def val_dataloader(self):
        if not self.val_length:
            return []
        return DataLoader(IndexedDataset(self.val_length), batch_size=self.batch_size, num_workers=0)


class RecordingModel(pl.LightningModule):
    """Records (epoch, sample index, worker epoch, draw) for every training sample, and val indices."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.rows: list[tuple[int, int, int, float]] = []
        self.val_indices: list[int] = []

    def training_step(self, batch, batch_idx):
        for index, epoch, draw in batch.tolist():
            self.rows.append((self.current_epoch, int(index), int(epoch), draw))
        return self.layer(batch[:, :1]).mean()

    def validation_step(self, batch, batch_idx):
        self.val_indices.extend(int(value) for value in batch[:, 0].tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def seeded_image(index):
    """The same uint8 image for an index every time, and the generator to draw more from."""
    generator = torch.Generator().manual_seed(index)
    return torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8, generator=generator), generator


class Checksummed(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        image, _ = seeded_image(index)
        return {"image": image, "index": index, "checksum": image.double().sum()}


class ChecksumModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.mismatches = []
        self.seen = []

    def training_step(self, batch, batch_idx):
        assert batch["image"].is_cuda
        device_sum = batch["image"].double().sum(dim=(1, 2, 3))
        self.mismatches.append((device_sum != batch["checksum"]).sum())
        self.seen.append(batch["index"])
        return self.layer(device_sum.float().unsqueeze(1) * 0).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


# ---------------------------------------------------------------- hand-made image files (PIL where installed)
def smooth_pixels(height: int, width: int, seed: int) -> torch.Tensor:
    """``[H, W, 3]`` uint8: low-frequency colour + a little noise (decoders agree closely on these)."""
    generator = torch.Generator().manual_seed(seed)
    low = torch.rand(1, 3, max(2, height // 16), max(2, width // 16), generator=generator) * 255
    base = torch.nn.functional.interpolate(low, size=(height, width), mode="bilinear", align_corners=False)[0]
    noise = torch.randn(3, height, width, generator=generator) * 4
    return (base + noise).clamp(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous()


def encode(pixels: torch.Tensor, mode: str = "RGB", fmt: str = "JPEG", **options) -> bytes:
    from PIL import Image

    image = Image.fromarray(pixels.numpy())
    if mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, quality=options.pop("quality", 92), **options) if fmt == "JPEG" else image.save(
        buffer, format=fmt, **options
    )
    return buffer.getvalue()


def write_files(root: str, count: int, sizes=((96, 128), (120, 80), (64, 64), (150, 110))) -> list[tuple[str, int]]:
    """``count`` baseline RGB JPEGs of varied sizes; returns ``(path, label)``."""
    os.makedirs(root, exist_ok=True)
    samples = []
    for i in range(count):
        height, width = sizes[i % len(sizes)]
        path = os.path.join(root, f"{i:04d}.jpg")
        with open(path, "wb") as file:
            file.write(encode(smooth_pixels(height, width, i)))
        samples.append((path, i % 5))
    return samples


def odd_files(root: str) -> dict[str, str]:
    """One file of each kind that must not take the batched nvJPEG path."""
    os.makedirs(root, exist_ok=True)
    pixels = smooth_pixels(72, 90, 99)
    contents = {
        "progressive": encode(pixels, progressive=True),
        "grayscale": encode(pixels, mode="L"),
        "cmyk": encode(pixels, mode="CMYK"),
        "png": encode(pixels, fmt="PNG"),
        "truncated": encode(pixels)[:-600],
        "zero": b"",
        "garbage": b"this is not an image at all" * 10,
    }
    paths = {}
    for name, data in contents.items():
        paths[name] = os.path.join(root, f"{name}.img")
        with open(paths[name], "wb") as file:
            file.write(data)
    return paths


def reference(data: bytes, box, flip: bool, size: int) -> torch.Tensor:
    """PIL decode + ``F.interpolate`` of the crop (bilinear, no antialias) + flip: ``[3, size, size]`` float 0..255."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        rgb = torch.from_numpy(__import__("numpy").asarray(image.convert("RGB")).copy()).permute(2, 0, 1)
    top, left, height, width = box
    crop = rgb[None, :, top : top + height, left : left + width].float()
    out = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False)[0]
    return out.flip(-1) if flip else out


class DrawingDataset(Dataset):
    """Sample ``i`` is ``[i, random.random(), torch.rand(1), numpy.random.random()]``: one draw from each of
    the three global generators an augmentation may use (``[i, 0, 0, 0]`` with ``draws=False``)."""

    def __init__(self, length: int, draws: bool = True) -> None:
        self.length, self.draws = length, draws

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        import numpy

        if not self.draws:
            return torch.tensor([float(index), 0.0, 0.0, 0.0], dtype=torch.float64)
        values = [float(index), random.random(), torch.rand(1).item(), float(numpy.random.random())]
        return torch.tensor(values, dtype=torch.float64)


class DrawingData(TunedDataModule):
    def __init__(self, length=30, batch_size=4, workers=0, draws=True, **kwargs):
        super().__init__(**kwargs)
        self.length, self.batch_size, self.workers, self.draws = length, batch_size, workers, draws

    def train_dataloader(self):
        dataset = DrawingDataset(self.length, self.draws)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, num_workers=self.workers)


class DrawingModel(pl.LightningModule):
    """Records ``(epoch, index, draws...)`` per training sample and one ``torch.rand`` per step (model side)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.rows: list[tuple[float, ...]] = []
        self.model_draws: list[float] = []

    def training_step(self, batch, batch_idx):
        self.rows.extend((self.current_epoch, *row) for row in batch.tolist())
        self.model_draws.append(torch.rand(1).item())
        return self.layer(batch[:, :1].float()).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def decode_backends(names=("nvimgcodec", "nvjpeg", "torchvision")) -> list:
    """``pytest.param`` per GPU decode backend, skipped where its library does not load (CUDA tests only)."""
    import pytest

    from lightning_dataperf.decode._nvimgcodec import import_nvimgcodec
    from lightning_dataperf.decode._nvjpeg import load_nvjpeg
    from lightning_dataperf.decode._torchvision import import_decode_jpeg

    loaders = {"nvimgcodec": import_nvimgcodec, "nvjpeg": load_nvjpeg, "torchvision": import_decode_jpeg}
    params = []
    for name in names:
        try:
            loaders[name]()
            missing = False
        except ImportError:
            missing = True
        params.append(pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"{name} not importable")))
    return params


class FakeClock:
    """A host clock that only moves when the test says so (patched in for ``time.perf_counter``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def recorded_evidence(monkeypatch) -> list:
    """Every ``Evidence`` the callback gathers during the test, in order."""
    from lightning_dataperf.callback import callback as callback_module

    gathered: list = []
    gather = callback_module.gather_evidence

    def recording(*args, **kwargs):
        gathered.append(gather(*args, **kwargs))
        return gathered[-1]

    monkeypatch.setattr(callback_module, "gather_evidence", recording)
    return gathered
