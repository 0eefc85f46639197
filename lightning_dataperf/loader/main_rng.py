"""The training process's generators seeded for one batch and put back, in microseconds: ``random``'s and NumPy's
Mersenne Twister words copied in and out of memory where their layout is the one checked, else their full states."""

from __future__ import annotations

import contextlib
import ctypes
import random
import struct
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["MainGenerators", "main_process_seeded", "numpy_module", "rng_restored"]

#: A Mersenne Twister's 624 32-bit words.
_MT_WORDS = 624


class _PythonRaw:
    """The global ``random`` generator's index and words, copied in and out of memory (``random.getstate`` and
    ``setstate`` took 11 of a batch's 23 us); ``None`` from :meth:`of` where the layout is not the one checked."""

    #: The C struct after the object header: ``int index; uint32_t state[624]``.
    SIZE = 4 + _MT_WORDS * 4

    def __init__(self, instance: random.Random) -> None:
        self.instance, self.address = instance, id(instance) + object.__basicsize__
        # one buffer, kept: a new 2.5-KB bytes object per batch cost 4 us in a fit
        self.saved, self.gauss_next = ctypes.create_string_buffer(self.SIZE), None

    @classmethod
    def of(cls) -> _PythonRaw | None:
        instance = getattr(random.random, "__self__", None)
        base = next((kind for kind in type(instance).__mro__ if kind.__module__ == "_random"), None)
        # never read past the object: the C part must hold the words where they are looked for
        if not isinstance(instance, random.Random) or base is None:
            return None
        if base.__basicsize__ < object.__basicsize__ + cls.SIZE:
            return None
        raw = cls(instance)
        _, state, _ = instance.getstate()
        words = ctypes.string_at(raw.address, cls.SIZE)
        return raw if words == struct.pack(f"<i{_MT_WORDS}I", state[-1], *state[:-1]) else None

    def save(self) -> None:
        ctypes.memmove(self.saved, self.address, self.SIZE)
        self.gauss_next = self.instance.gauss_next

    def restore(self) -> None:
        ctypes.memmove(self.address, self.saved, self.SIZE)
        self.instance.gauss_next = self.gauss_next


class _PythonState:
    """The global ``random`` generator's full state, saved and restored where its layout is not the one checked."""

    def __init__(self) -> None:
        self.state: Any = None

    def save(self) -> None:
        self.state = random.getstate()

    def restore(self) -> None:
        random.setstate(self.state)


def numpy_module() -> Any:
    """NumPy where it is installed, else ``None``."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is optional
        return None
    return numpy


@contextlib.contextmanager
def rng_restored(cuda: bool = True) -> Iterator[None]:
    """Afterwards ``random``, NumPy's global generator and torch's CPU generator (and, with ``cuda``,
    the initialised CUDA devices' generators) are back in the states they had (also when the block raises)."""
    numpy = numpy_module()
    python_state = random.getstate()
    numpy_state = None if numpy is None else numpy.random.get_state()
    devices = list(range(torch.cuda.device_count())) if cuda and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)


@contextlib.contextmanager
def main_process_seeded(seed: int) -> Iterator[None]:
    """Within the block ``random``, NumPy's global generator and torch's CPU generator start from
    ``seed``; afterwards each is back in the state it had before (also when the block raises)."""
    with rng_restored(cuda=False):  # CUDA's generators are neither seeded nor touched
        random.seed(seed)
        torch.default_generator.manual_seed(seed)  # not torch.manual_seed: that also reseeds CUDA's
        if (numpy := numpy_module()) is not None:
            numpy.random.seed(seed % 2**32)
        yield


#: NumPy's MT19937 state in memory: 624 32-bit words and the position (checked against ``state`` before use).
_MT_BYTES = _MT_WORDS * 4 + 4


class _NumpyRaw:
    """The global NumPy generator's MT19937 words, copied in and out of memory (a microsecond; ``get_state`` and
    ``set_state`` took about 65 us a batch, most of a 1-ms step's seeding); ``None`` from :meth:`of` where the
    layout is not the one checked."""

    def __init__(self, generator: Any) -> None:
        self.generator, self.address = generator, generator._bit_generator.ctypes.state_address

    @classmethod
    def of(cls, numpy: Any) -> _NumpyRaw | None:
        generator = getattr(getattr(numpy.random, "mtrand", None), "_rand", None)
        try:
            raw = cls(generator)
            state = generator._bit_generator.state["state"]
            words = state["key"].astype("<u4").tobytes() + int(state["pos"]).to_bytes(4, "little", signed=True)
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        return raw if raw.read() == words else None

    def read(self) -> bytes:
        return ctypes.string_at(self.address, _MT_BYTES)

    def write(self, words: bytes) -> None:
        ctypes.memmove(self.address, words, _MT_BYTES)


class MainGenerators:
    """Seeds the training process's generators for one batch and puts the user's states back, doing only what
    exactness needs: NumPy's full state is read only where the user's generator moved (or holds a cached normal)
    since it was last read, and written back in full only where the batch drew from it."""

    def __init__(self) -> None:
        numpy = numpy_module()
        self.numpy = numpy
        self.raw = None if numpy is None else _NumpyRaw.of(numpy)
        self.python: _PythonRaw | _PythonState = _PythonRaw.of() or _PythonState()
        self.user_words: bytes | None = None
        self.user_state: Any = None

    def fetch(self, seed: int, inner: Iterator[Any]) -> Any:
        """``next(inner)`` with the generators seeded from ``seed``, the user's states back afterwards."""
        if self.numpy is not None and self.raw is None:  # an unknown layout: the full save and restore
            with main_process_seeded(seed):
                return next(inner)
        self.python.save()
        torch_state = torch.get_rng_state()
        seeded_words = self._seed_numpy(seed)
        random.seed(seed)
        torch.default_generator.manual_seed(seed)
        try:
            return next(inner)
        finally:
            self.python.restore()
            torch.set_rng_state(torch_state)
            self._restore_numpy(seeded_words)

    def _seed_numpy(self, seed: int) -> bytes | None:
        raw = self.raw
        if raw is None:
            return None
        words = raw.read()
        # a user's cached normal (has_gauss) is used without moving the words: then the full state is read each time
        if words != self.user_words or self.user_state is None or self.user_state[3]:
            self.user_words, self.user_state = words, self.numpy.random.get_state()
        self.numpy.random.seed(seed % 2**32)
        return raw.read()

    def _restore_numpy(self, seeded_words: bytes | None) -> None:
        raw = self.raw
        if raw is None or seeded_words is None:
            return
        if raw.read() == seeded_words and not self.user_state[3]:
            # the batch drew nothing from NumPy, and the user's state held no cached normal for the seeding to clear
            raw.write(self.user_words)  # type: ignore[arg-type]
        else:
            self.numpy.random.set_state(self.user_state)
