"""The sample order autotune's trials read: one fixed, shuffle-like order, each trial its own slice of it."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from torch.utils.data import Sampler

__all__ = ["TrialOrder", "coprime_stride"]


class TrialOrder(Sampler[int]):
    """Each trial reads its own slice of one fixed order (no trial rereads another's samples): a seeded affine
    permutation, spread over the dataset like a shuffle but computed per position, not drawn.

    Example::

        order = TrialOrder(length=1000, start=0, stride=coprime_stride(1000))
        first = list(order)[:4]      # four distinct indices spread over the dataset
    """

    def __init__(self, length: int, start: int, stride: int) -> None:
        self.length, self.start, self.stride = length, start, stride

    def __iter__(self) -> Iterator[int]:
        length, stride, start = self.length, self.stride, self.start
        return (stride * (start + step) % length for step in range(length))

    def __len__(self) -> int:
        return self.length


def coprime_stride(length: int) -> int:
    """A seeded stride coprime with ``length`` (1 for one or two samples)."""
    stride = random.Random(0).randrange(length // 3, length) if length > 2 else 1
    while math.gcd(stride, length) > 1:
        stride += 1
    return stride
