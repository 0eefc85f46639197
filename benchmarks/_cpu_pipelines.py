"""CPU pipelines whose steps compute for real (issue 37): their data, models and the fits that measure them.

Shared by ``online.py`` (the closed loop against a grid) and ``verdicts.py`` (the verdict's advice applied).
"""

from __future__ import annotations

import atexit
import os
import random
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from _common import quiet_trainer
from _synthetic import SmallClassifier, SyntheticImages

from lightning_dataperf import DataPerfCallback, TunedDataModule


class FftSamples(Dataset):
    """A numpy FFT transform per sample (about 3 ms on one core), into a 1024-float vector."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        signal = np.random.default_rng(index).standard_normal((192, 192))
        for _ in range(3):
            signal = np.abs(np.fft.ifft2(np.fft.fft2(signal) * 0.5))
        return torch.from_numpy(signal[:32, :32].astype(np.float32).ravel()), index % 10


class SmallDicts(Dataset):
    """A dict of small tensors per sample, cheap to make: the hand-over dominates a worker's cost."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return {
            "x": torch.rand(64, generator=generator),
            "mask": torch.ones(64, dtype=torch.bool),
            "y": torch.tensor(index % 10),
        }


class Records(Dataset):
    """Samples of many small tensors and a Python-heavy collate (a tokenised-text stand-in that computes)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return [torch.rand(16, generator=generator) for _ in range(32)]


def collate_records(samples: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [torch.stack(parts).mean(0) + torch.stack(parts).std(0) for parts in samples]
    return torch.stack(rows), torch.tensor([len(rows) % 10] * len(rows))


_SYLLABLES = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"] + ["st", "tr", "ng", "sh", "ch"]


def _vocabulary(size: int = 3000) -> dict[str, int]:
    """Subword pieces of one to three syllables, numbered from 2 (0: unknown and padding, 1: start)."""
    rng = random.Random(0)
    pieces = set(_SYLLABLES)
    while len(pieces) < size:
        pieces.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))))
    return {piece: number + 2 for number, piece in enumerate(sorted(pieces))}


VOCABULARY = _vocabulary()
_LONGEST = max(map(len, VOCABULARY))


def tokenise(text: str, length: int = 64) -> list[int]:
    """Greedy longest-match subword tokenisation in pure Python (about 1 ms for a sample's 240 words)."""
    ids = [1]
    for word in text.split():
        start = 0
        while start < len(word):
            for end in range(min(len(word), start + _LONGEST), start, -1):
                piece = VOCABULARY.get(word[start:end])
                if piece is not None:
                    ids.append(piece)
                    start = end
                    break
            else:
                ids.append(0)
                start += 1
    ids = ids[:length]
    return ids + [0] * (length - len(ids))


class TokenisedText(Dataset):
    """A synthetic text per index (240 words of syllables), tokenised in ``__getitem__`` (issue 49's pipeline)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = random.Random(index)
        words = ("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 5))) for _ in range(240))
        return torch.tensor(tokenise(" ".join(words))), index % 10


class Encoder(pl.LightningModule):
    """An embedding, one Transformer encoder layer (64 wide, 4 heads) and a linear head over the mean token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCABULARY) + 2, 64)
        self.layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
        self.head = nn.Linear(64, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tokens, labels = batch
        return nn.functional.cross_entropy(self.head(self.layer(self.embed(tokens)).mean(1)), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Mlp(pl.LightningModule):
    """An MLP that does real arithmetic on the CPU (``width`` sets its cost)."""

    def __init__(self, inputs: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if isinstance(batch, dict):
            inputs, labels = batch["x"] * batch["mask"], batch["y"]
        else:
            inputs, labels = batch
        inputs = inputs.flatten(1)
        return nn.functional.cross_entropy(self.head(self.net(inputs)), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


#: the verdict's summaries file and any Lightning output go here, not into the working directory
ROOT_DIR = tempfile.mkdtemp(prefix="dataperf_online_")
atexit.register(shutil.rmtree, ROOT_DIR, ignore_errors=True)

PIPELINES: dict[str, dict[str, Any]] = {
    # the README quickstart: 1 ms of busy work per sample in the loader, the examples' small MLP
    "quickstart": {
        "data": lambda n: SyntheticImages(n, work_ms=1.0),
        "model": SmallClassifier,
        "batch": 32,
        "start": 0,
    },
    "fft": {"data": FftSamples, "model": lambda: Mlp(1024, 512), "batch": 32, "start": 1},
    "dicts": {"data": SmallDicts, "model": lambda: Mlp(64, 256), "batch": 8, "start": 0},
    "io": {"data": lambda n: SyntheticImages(n, sleep_ms=4.0), "model": SmallClassifier, "batch": 16, "start": 2},
    # tiny batches and a step whose Python (many small layers) dominates its arithmetic
    "tiny": {"data": lambda n: SyntheticImages(n, shape=(64,)), "model": lambda: Mlp(64, 64), "batch": 2, "start": 0},
    "collate": {"data": Records, "model": lambda: Mlp(16, 256), "batch": 64, "start": 0, "collate": collate_records},
    # issue 49's newcomer pipeline: a pure-Python subword tokeniser (~1 ms a sample), a one-layer Transformer
    "tokeniser": {"data": TokenisedText, "model": Encoder, "batch": 32, "start": 0},
    # large float batches (8 MB) made cheaply: the hand-over from a worker is the cost
    "large": {
        "data": lambda n: SyntheticImages(n, shape=(3, 64, 64)),
        "model": lambda: Mlp(3 * 64 * 64, 64),
        "batch": 512,
        "start": 0,
    },
}


class Pipeline(TunedDataModule):
    def __init__(self, name: str, workers: int | None, **kwargs: Any) -> None:
        super().__init__(seed=0, verbose=False, **kwargs)
        self.spec, self.workers = PIPELINES[name], workers

    def train_dataloader(self) -> DataLoader:
        options = {} if self.workers is None else {"num_workers": self.workers}
        if "collate" in self.spec:
            options["collate_fn"] = self.spec["collate"]
        return DataLoader(self.spec["data"](200_000), batch_size=self.spec["batch"], shuffle=True, **options)


class StepClock(Callback):
    """Times steps from the batch after start-up; stops the fit after ``seconds`` of them."""

    def __init__(self, seconds: float, skip: int) -> None:
        self.seconds, self.skip, self.times = seconds, skip, []

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.times.append(time.perf_counter())
        # not a slice of all the times per step: over 90,000 tiny steps that copy slowed them by a quarter
        steady = len(self.times) - self.skip
        if steady > 2 and self.times[-1] - self.times[self.skip] >= self.seconds:
            trainer.should_stop = True

    def rate(self) -> float:
        steady = self.times[self.skip :]
        return (len(steady) - 1) / (steady[-1] - steady[0])


def trainer(callbacks: list[Callback], **options: Any) -> pl.Trainer:
    return quiet_trainer(
        # a root of its own: the online loop would start the next fit from the setting this one saved
        default_root_dir=tempfile.mkdtemp(dir=ROOT_DIR),
        accelerator="cpu",
        max_epochs=options.pop("max_epochs", 1),
        callbacks=callbacks,
        **options,
    )


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


#: Cores' worth of CPU used by other processes during each measurement (2 intra-op threads on 2 cores read
#: 13-25 steps/s on "tiny" beside one busy process, 460-485 on a quiet machine): a row's disturbance.
OTHERS: list[float] = []


def _cpu_seconds() -> tuple[float, float]:
    """(the machine's busy CPU seconds, this process's and its reaped children's)."""
    fields = [float(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    own = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime for who in (0, -1))
    return busy, own


def measure(name: str, workers: int, threads: int, seconds: float) -> float:
    """One fit's steady steps/s at ``workers`` loader workers and ``threads`` intra-op threads."""
    torch.set_num_threads(threads)
    # intra_op_threads=None: "auto" set 1 thread beside any workers on 2 cores, so every "Nw 2t" point ran at 1
    return _timed_fit(name, Pipeline(name, workers, intra_op_threads=None), 2 * workers + 3, seconds)


def measure_default(name: str, seconds: float) -> tuple[float, tuple[int, int]]:
    """One fit's steady steps/s with ``TunedDataModule`` at its defaults (torch's own thread count before it), and
    the (workers, threads) it chose."""
    cpus = usable_cpus()
    torch.set_num_threads(cpus)
    module = Pipeline(name, None)
    rate = _timed_fit(name, module, 2 * cpus + 3, seconds)
    (plan,) = module.loader_plans["train"]
    return rate, (plan.chosen["num_workers"], plan.chosen.get("intra_op_threads", cpus))


def _timed_fit(name: str, module: Pipeline, skip: int, seconds: float) -> float:
    clock = StepClock(seconds, skip=skip)
    (busy, own), started = _cpu_seconds(), time.perf_counter()
    trainer([clock]).fit(PIPELINES[name]["model"](), datamodule=module)
    (busy_after, own_after), wall = _cpu_seconds(), time.perf_counter() - started
    OTHERS.append(max(0.0, (busy_after - busy) - (own_after - own)) / wall)
    return clock.rate()


class Verdicts(Callback):
    """Each epoch's verdict (after DataPerfCallback wrote it): the bottleneck, the advised workers, the estimate."""

    def __init__(self, perf: DataPerfCallback) -> None:
        self.perf, self.epochs = perf, []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        diagnosis, load = self.perf.last_diagnosis, os.getloadavg()[0]  # other processes skew a verdict
        if diagnosis is None or not diagnosis.findings:
            self.epochs.append({"bottleneck": "unknown", "workers": None, "estimate": None, "text": "", "load": load})
            return
        advice = " ".join(advice for finding in diagnosis.findings for advice in finding.advice)
        workers = re.search(r"num_workers(?:=| from \d+ to )(\d+)", advice)
        threads = re.search(r"torch.set_num_threads\((\d+)\)", advice)
        estimate = re.search(r"up to ([0-9.]+)x", advice)
        self.epochs.append(
            {
                "bottleneck": diagnosis.bottleneck,
                "workers": int(workers.group(1)) if workers else None,
                "threads": int(threads.group(1)) if threads else None,
                "estimate": float(estimate.group(1)) if estimate else None,
                "text": diagnosis.format(),
                "load": load,
            }
        )


def verdicts_at_start(name: str, threads: int, batches: int, epochs: int = 3) -> list[dict[str, Any]]:
    """The callback's verdict in each of ``epochs`` epochs of ``batches`` steps at the pipeline's start setting."""
    torch.set_num_threads(threads)
    perf = DataPerfCallback(telemetry_interval=0.25)
    verdicts = Verdicts(perf)
    trainer([perf, verdicts], log_every_n_steps=5, max_epochs=epochs, limit_train_batches=batches).fit(
        PIPELINES[name]["model"](), datamodule=Pipeline(name, PIPELINES[name]["start"])
    )
    return verdicts.epochs


#: An advised change that measures below this made training slower (issue 37's target).
SLOWER = 0.97


def computing(name: str, pairs: int, seconds: float) -> list[dict]:
    """A CPU pipeline that computes: the verdict per epoch at its start setting, the advised change measured."""
    cpus, measured_before = usable_cpus(), len(OTHERS)
    start = (PIPELINES[name]["start"], cpus)
    rate = measure(name, *start, seconds)  # sizes the verdict's epochs: about 2 x ``seconds`` each
    epochs = verdicts_at_start(name, cpus, max(20, int(rate * seconds * 2)))
    last = epochs[-1]
    cannot = "cannot help" in last["text"]
    advised = (start[0] + 1, cpus) if cannot else None
    if last["workers"] is not None:
        advised = (last["workers"], last["threads"] or cpus)
    predicted = 1.0 if cannot else last["estimate"]
    ratios = []
    for pair in range(pairs if advised and advised != start else 0):
        order = [start, advised] if pair % 2 == 0 else [advised, start]
        got = {point: measure(name, *point, seconds) for point in order}
        ratios.append(got[advised] / got[start])
    measured = statistics.median(ratios) if ratios else None
    ok = None
    if measured is not None:
        delivers = predicted is None or predicted < 1.1 or measured - 1 >= 0.5 * (predicted - 1)
        ok = measured < 1.10 if cannot else measured >= SLOWER and delivers
    steady = [epoch["bottleneck"] for epoch in epochs[1:]]
    result = {
        "row": name,
        "expected": "",
        "verdict": last["bottleneck"],
        "epochs": [epoch["bottleneck"] for epoch in epochs],
        "steady_same": all(kind == steady[-1] for kind in steady),
        "right": None,
        "start": list(start),
        "advised": None if advised is None else list(advised),
        "before_sps": rate * PIPELINES[name]["batch"],
        "predicted": predicted,
        "measured": measured,
        "pair_ratios": ratios,
        "ok": ok,
        "note": f"start {start[0]}w {start[1]}t" + ("" if advised is None else f" -> {advised[0]}w {advised[1]}t"),
        "verdict_text": last["text"],
        "verdicts": epochs,
        "others_cores_max": max(OTHERS[measured_before:]),
    }
    print(f"\n=== {name}: verdicts {result['epochs']}\n{last['text']}\n{result['note']}: {ratios}", flush=True)
    return [result]
