"""Encoded-JPEG batches: workers read bytes and draw augmentations, the GPU decodes (issue 17).

:class:`EncodedImageDataset` reads and classifies; :func:`collate_encoded` packs a batch into three tensors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from lightning_dataperf._lightning_hooks import shared_storage
from lightning_dataperf.decode.headers import (
    KIND_BAD,
    center_crop_params,
    probe_image,
    random_resized_crop_params,
)
from lightning_dataperf.loader.seeding import SharedEpoch

__all__ = [
    "EncodedBatch",
    "EncodedImageDataset",
    "EncodedSample",
    "collate_encoded",
    "encoded_loader_defaults",
    "is_encoded_dataset",
    "sample_seed",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
# Columns of EncodedBatch.meta.
_LABEL, _INDEX, _KIND, _HEIGHT, _WIDTH, _TOP, _LEFT, _BOX_H, _BOX_W, _FLIP = range(10)
_COLUMNS = 10


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed for one sample's augmentation that depends only on its three inputs."""
    digest = hashlib.blake2b(f"sample/{seed}/{epoch}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class EncodedSample:
    """One sample as a worker returns it: the file's bytes and everything drawn for it."""

    data: bytes
    label: int
    index: int
    kind: int
    height: int
    width: int
    box: tuple[int, int, int, int]
    flip: bool
    path: str
    reason: str = ""


class EncodedImageDataset(Dataset):
    """Reads encoded images and draws their augmentation; decodes nothing.

    Args:
        samples: ``(path, label)`` pairs.
        seed: the run's seed; with the epoch and the dataset index it fixes each sample's crop and flip.
        train: RandomResizedCrop + flip; ``False``: the evaluation centre crop, no flip.
        scale, ratio: RandomResizedCrop's ranges.
        flip_p: probability of a horizontal flip.
        crop_fraction: evaluation crop side over the short side.

    Example::

        dataset = EncodedImageDataset.from_folder("/data/imagenet/train", seed=42)
        loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=4,
                            collate_fn=collate_encoded, persistent_workers=True)
        for epoch in range(3):
            dataset.set_epoch(epoch)
            for batch in loader:            # EncodedBatch
                ...
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        seed: int = 0,
        train: bool = True,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip_p: float = 0.5,
        crop_fraction: float = 0.875,
    ) -> None:
        self.samples = [(os.fspath(path), int(label)) for path, label in samples]
        self.seed, self.train, self.scale, self.ratio = seed, train, scale, ratio
        self.flip_p, self.crop_fraction = flip_p, crop_fraction
        # in shared memory, so persistent workers see set_epoch
        self._epoch = SharedEpoch()
        self.classes: list[str] = []

    @classmethod
    def from_folder(cls, root: str | os.PathLike, **kwargs: Any) -> EncodedImageDataset:
        """An ``ImageFolder``-style tree: ``root/<class>/<image>``, classes sorted by name."""
        root = os.fspath(root)
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        samples = []
        for label, name in enumerate(classes):
            for directory, _, files in sorted(os.walk(os.path.join(root, name))):
                samples.extend(
                    (os.path.join(directory, file), label)
                    for file in sorted(files)
                    if file.lower().endswith(IMAGE_EXTENSIONS)
                )
        dataset = cls(samples, **kwargs)
        dataset.classes = classes
        return dataset

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's augmentations (visible to persistent workers too)."""
        self._epoch.set(int(epoch))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> EncodedSample:
        path, label = self.samples[index]
        with open(path, "rb") as file:
            data = file.read()
        probe = probe_image(data)
        if probe.kind == KIND_BAD:
            return EncodedSample(data, label, index, KIND_BAD, 0, 0, (0, 0, 1, 1), False, path, probe.reason)
        rng = random.Random(sample_seed(self.seed, self.epoch, index))
        if self.train:
            box = random_resized_crop_params(rng, probe.height, probe.width, self.scale, self.ratio)
            flip = rng.random() < self.flip_p
        else:
            box, flip = center_crop_params(probe.height, probe.width, self.crop_fraction), False
        return EncodedSample(data, label, index, probe.kind, probe.height, probe.width, box, flip, path, probe.reason)


@dataclass(frozen=True)
class EncodedBatch:
    """A batch of encoded images: one ``uint8`` byte tensor, ``int64`` offsets, one ``int64`` metadata table.

    Sample ``i``'s bytes are ``data[offsets[i]:offsets[i + 1]]``. ``meta`` columns: label, dataset
    index, kind, height, width, crop top, left, height, width, flip. A dataclass of tensors, so the
    package's ``map_tensors`` (and Lightning's transfer) can move it; ``pin_memory()`` for the loader.
    Split decode (``decode.split``): ``pixels`` ``[k, size, size, 3]`` uint8, the samples at ``positions``
    already decoded, cropped, resized and flipped on the CPU (their bytes left out); ``None`` where not split.
    """

    data: torch.Tensor
    offsets: torch.Tensor
    meta: torch.Tensor
    paths: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    pixels: torch.Tensor | None = None
    positions: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.meta.shape[0])

    @property
    def labels(self) -> torch.Tensor:
        return self.meta[:, _LABEL]

    @property
    def indices(self) -> torch.Tensor:
        return self.meta[:, _INDEX]

    @property
    def kinds(self) -> torch.Tensor:
        return self.meta[:, _KIND]

    @property
    def sizes(self) -> torch.Tensor:
        """``[B, 2]``: height, width from the header."""
        return self.meta[:, _HEIGHT : _WIDTH + 1]

    @property
    def boxes(self) -> torch.Tensor:
        """``[B, 4]``: top, left, height, width of the crop in source pixels."""
        return self.meta[:, _TOP : _BOX_W + 1]

    @property
    def flips(self) -> torch.Tensor:
        return self.meta[:, _FLIP].bool()

    def encoded(self, i: int) -> torch.Tensor:
        """Sample ``i``'s bytes (a view)."""
        offsets = self.offsets.tolist() if self.offsets.device.type == "cpu" else self.offsets.cpu().tolist()
        return self.data[offsets[i] : offsets[i + 1]]

    def split(self) -> list[torch.Tensor]:
        """Every sample's bytes as views of ``data``."""
        offsets = self.offsets.tolist()
        return [self.data[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]

    def to(self, *args: Any, **kwargs: Any) -> EncodedBatch:
        return self._map(lambda tensor: tensor.to(*args, **kwargs))

    def pin_memory(self, device: Any = None) -> EncodedBatch:
        del device
        # the split's pixels too: uint8 over PCIe from pinned memory
        return self._map(lambda tensor: tensor.pin_memory())

    def _map(self, function: Any) -> EncodedBatch:
        pixels, positions = self.pixels, self.positions
        return dataclasses.replace(
            self, data=function(self.data), offsets=function(self.offsets), meta=function(self.meta),
            pixels=None if pixels is None else function(pixels),
            positions=None if positions is None else function(positions),
        )  # fmt: skip


def collate_encoded(samples: Sequence[EncodedSample]) -> EncodedBatch:
    """Pack a batch of :class:`EncodedSample` into one :class:`EncodedBatch` (one byte copy).

    In a DataLoader worker the bytes are written straight into shared memory (as ``default_collate`` does
    for its stacked tensors), so sending the batch to the main process copies nothing more: before, the
    bytes were joined, copied into a ``bytearray`` and copied again into shared memory when sent, each
    copy into freshly mapped pages (measured: 20 ms of a 2-core machine's time per batch of 128 x 77 kB).
    """
    lengths = [len(sample.data) for sample in samples]
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    total = sum(lengths)
    if samples:
        offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    if total and torch.utils.data.get_worker_info() is not None:
        storage = shared_storage(total)
        data = torch.empty(0, dtype=torch.uint8).set_(storage)
        view, position = memoryview(data.numpy()), 0
        for sample, length in zip(samples, lengths, strict=True):
            view[position : position + length] = sample.data
            position += length
    elif total:
        data = torch.frombuffer(bytearray(b"".join(sample.data for sample in samples)), dtype=torch.uint8)
    else:
        data = torch.empty(0, dtype=torch.uint8)
    rows = [
        (s.label, s.index, s.kind, s.height, s.width, *s.box, int(s.flip)) for s in samples
    ]  # fmt: skip
    meta = torch.tensor(rows, dtype=torch.int64).reshape(len(samples), _COLUMNS)
    paths = tuple(sample.path for sample in samples)
    reasons = tuple(sample.reason for sample in samples)
    return EncodedBatch(data, offsets, meta, paths, reasons)


#: With GPU decode the workers only read files: this many are enough.
GPU_DECODE_MAX_WORKERS = 4


def is_encoded_dataset(dataset: Any) -> bool:
    return isinstance(dataset, EncodedImageDataset)


def encoded_loader_defaults(explicit: dict[str, Any], policy_workers: int | None) -> dict[str, tuple[Any, str]]:
    """``{argument: (value, reason)}`` for a DataLoader whose batches the GPU decodes (what you pass wins)."""
    changes: dict[str, tuple[Any, str]] = {}
    if explicit.get("collate_fn") is None:
        changes["collate_fn"] = (collate_encoded, "")
    if "num_workers" not in explicit and (policy_workers or 0) > GPU_DECODE_MAX_WORKERS:
        reason = f"GPU decode: the workers only read files ({GPU_DECODE_MAX_WORKERS} at most)"
        changes["num_workers"] = (GPU_DECODE_MAX_WORKERS, reason)
    return changes
