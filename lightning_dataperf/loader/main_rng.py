"""The training process's generators seeded for one batch and put back, in microseconds: only those the batches
draw from, ``random``'s and NumPy's states copied in and out of memory where their layout is the one checked."""

from __future__ import annotations

import contextlib
import ctypes
import random
import struct
from collections.abc import Hashable, Iterator
from typing import Any, Protocol

import torch

__all__ = ["LEARNING_FETCHES", "MainGenerators", "numpy_key", "numpy_module", "rng_restored"]

#: A Mersenne Twister's 624 32-bit words.
_MT_WORDS = 624
#: Batches of an iterator fetched with ``random`` and NumPy seeded whether or not they draw from them.
LEARNING_FETCHES = 64


class _PythonRaw:
    """The global ``random`` generator's index and words, copied in and out of memory (``random.getstate`` and
    ``setstate`` took 11 of a batch's 23 us); ``None`` from :meth:`of` where the layout is not the one checked."""

    #: The C struct after the object header: ``int index; uint32_t state[624]``.
    SIZE = 4 + _MT_WORDS * 4
    #: A draw is seen in place (:meth:`marker`): the generator may be left unseeded.
    watchable = True

    def __init__(self, instance: random.Random) -> None:
        self.instance, self.address = instance, id(instance) + object.__basicsize__
        # one buffer, kept: a new 2.5-KB bytes object per batch cost 4 us in a fit
        self.saved, self.gauss_next = ctypes.create_string_buffer(self.SIZE), None
        # the index and the first word, read in place
        self.head = (ctypes.c_uint32 * 2).from_address(self.address)

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

    def marker(self) -> tuple[int, int, float | None]:
        """The index and first word, and the cached normal: any draw changes them (a twist rewrites every word)."""
        head = self.head
        return head[0], head[1], self.instance.gauss_next

    def save(self) -> None:
        ctypes.memmove(self.saved, self.address, self.SIZE)
        self.gauss_next = self.instance.gauss_next

    def restore(self) -> None:
        ctypes.memmove(self.address, self.saved, self.SIZE)
        self.instance.gauss_next = self.gauss_next

    def seed(self, seed: int) -> None:
        random.seed(seed)


class _PythonState:
    """The global ``random`` generator's full state, saved and restored where its layout is not the one checked."""

    watchable = False

    def __init__(self) -> None:
        self.state: Any = None

    def marker(self) -> None:
        """``None``: a draw is not cheaply seen here (not :attr:`watchable`: seeded for every batch)."""
        return None

    def save(self) -> None:
        self.state = random.getstate()

    def restore(self) -> None:
        random.setstate(self.state)

    def seed(self, seed: int) -> None:
        random.seed(seed)


def numpy_module() -> Any:
    """NumPy where it is installed, else ``None``."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is optional
        return None
    return numpy


#: Mixed into NumPy's key so that it never equals torch's for a seed below 2**32.
_NUMPY_KEY_MIX = 0x5851F42D


def numpy_key(seed: int) -> int:
    """NumPy's 32-bit seed for ``seed``. torch's CPU generator and NumPy's legacy one both seed a Mersenne Twister
    from the low 32 bits alone: seeded alike, a coin flip from one is the other's, so NumPy's key mixes in the high
    bits and a constant."""
    return ((seed & 0xFFFFFFFF) ^ (seed >> 32) ^ _NUMPY_KEY_MIX) & 0xFFFFFFFF


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


#: NumPy's MT19937 state in memory: 624 32-bit words and the position (checked against ``state`` before use).
_MT_BYTES = _MT_WORDS * 4 + 4
#: A cached normal no generator holds by chance, looked for in the generator's memory to find where it is kept.
_PROBE_GAUSS = 0.123456789012345


class _NumpyRaw:
    """The global NumPy generator's MT19937 words and cached normal, copied in and out of memory (about a
    microsecond; ``get_state`` and ``set_state`` took 31 and 34 us); ``None`` from :meth:`of` where the layout
    is not the one checked."""

    watchable = True

    def __init__(self, numpy: Any, words: int, gauss: int) -> None:
        self.numpy, self.words = numpy, words
        # a kept buffer: a new 2.5-KB bytes object per batch cost 4 us in a fit
        self.saved_words = ctypes.create_string_buffer(_MT_BYTES)
        # read and written in place: the words and position, the cached normal's flag and value
        self.view = (ctypes.c_uint32 * (_MT_WORDS + 1)).from_address(words)
        self.has_gauss, self.gauss = ctypes.c_int32.from_address(gauss), ctypes.c_double.from_address(gauss + 8)
        self.saved_gauss = (0, 0.0)

    @classmethod
    def of(cls, numpy: Any) -> _NumpyRaw | None:
        generator = getattr(getattr(numpy.random, "mtrand", None), "_rand", None)
        try:
            words = generator._bit_generator.ctypes.state_address
            state = generator.get_state()
            expected = state[1].astype("<u4").tobytes() + int(state[2]).to_bytes(4, "little", signed=True)
            if ctypes.string_at(words, _MT_BYTES) != expected:
                return None
            gauss = cls._find_gauss(generator, state)
        except (AttributeError, IndexError, TypeError, ValueError):
            return None
        return None if gauss is None else cls(numpy, words, gauss)

    @staticmethod
    def _find_gauss(generator: Any, state: tuple) -> int | None:
        """Where the generator object keeps ``has_gauss`` and ``gauss``: found by a probe value, checked both ways."""
        size = type(generator).__basicsize__
        try:
            generator.set_state((*state[:3], 1, _PROBE_GAUSS))
            memory = ctypes.string_at(id(generator), size)
            offset = memory.find(struct.pack("<d", _PROBE_GAUSS)) - 8
            generator.set_state((*state[:3], 0, 0.0))
            cleared = ctypes.string_at(id(generator), size)
        finally:
            generator.set_state(state)
        # never read past the object: the flag and the value must both be inside it, and read as set
        if offset < object.__basicsize__ or memory.count(struct.pack("<d", _PROBE_GAUSS)) != 1:
            return None
        # ``int has_gauss`` padded to 8 bytes, then ``double gauss``
        flag, value = slice(offset, offset + 4), slice(offset + 8, offset + 16)
        if memory[flag] != struct.pack("<i", 1) or cleared[flag] != bytes(4) or cleared[value] != bytes(8):
            return None
        return id(generator) + offset

    def marker(self) -> tuple[int, int, int, float]:
        """The first word, the position and the cached normal: any draw changes them (a twist rewrites every word)."""
        view = self.view
        return view[0], view[_MT_WORDS], self.has_gauss.value, self.gauss.value

    def save(self) -> None:
        ctypes.memmove(self.saved_words, self.words, _MT_BYTES)
        self.saved_gauss = (self.has_gauss.value, self.gauss.value)

    def restore(self) -> None:
        ctypes.memmove(self.words, self.saved_words, _MT_BYTES)
        self.has_gauss.value, self.gauss.value = self.saved_gauss

    def seed(self, seed: int) -> None:
        self.numpy.random.seed(numpy_key(seed))


class _NumpyState:
    """The global NumPy generator's full state, saved and restored where its layout is not the one checked."""

    watchable = False

    def __init__(self, numpy: Any) -> None:
        self.numpy, self.state = numpy, None

    def marker(self) -> None:
        """``None``: a draw is not cheaply seen here (not :attr:`watchable`: seeded for every batch)."""
        return None

    def save(self) -> None:
        self.state = self.numpy.random.get_state()

    def restore(self) -> None:
        self.numpy.random.set_state(self.state)

    def seed(self, seed: int) -> None:
        self.numpy.random.seed(numpy_key(seed))


class _Watched(Protocol):
    """One generator as :class:`MainGenerators` handles it."""

    #: Whether :meth:`marker` sees a draw; a generator that is not is seeded for every batch.
    watchable: bool

    def marker(self) -> Hashable | None:
        """What any draw changes (``None`` where not :attr:`watchable`)."""

    def save(self) -> None: ...

    def restore(self) -> None: ...

    def seed(self, seed: int) -> None: ...


class MainGenerators:
    """Seeds the training process's generators for one batch and puts the user's states back, doing only what
    exactness needs. torch's is seeded for every batch. ``random`` and NumPy are seeded for the first
    :data:`LEARNING_FETCHES` batches of an iterator and afterwards only where one of those drew from them; one left
    unseeded is watched (its state compared before and after), and a batch that draws from it is reported in
    :attr:`missed`, the user's state put back, and the generator seeded from the next batch on."""

    def __init__(self) -> None:
        numpy = numpy_module()
        watched: list[tuple[str, _Watched]] = [("random", _PythonRaw.of() or _PythonState())]
        if numpy is not None:
            watched.append(("numpy", _NumpyRaw.of(numpy) or _NumpyState(numpy)))
        self.watched = watched
        self.fetches = 0
        #: The generators (``"random"``, ``"numpy"``) some batch of this iterator drew from: seeded for every batch.
        self.drawn: set[str] = set()
        #: The generators the last batch drew from unseeded (after the learning batches; reported by the caller).
        self.missed: list[str] = []

    def fetch(self, seed: int, inner: Iterator[Any]) -> Any:
        """``next(inner)`` with the generators seeded from ``seed``, the user's states back afterwards."""
        learning = self.fetches < LEARNING_FETCHES
        self.fetches += 1
        started: list[tuple[str, _Watched, bool, Hashable | None]] = []
        for name, generator in self.watched:
            generator.save()
            known = name in self.drawn
            seeded = learning or known or not generator.watchable
            if seeded:
                generator.seed(seed)
            # a generator known to be drawn from is seeded for every batch: nothing left to watch
            started.append((name, generator, seeded, None if known else generator.marker()))
        main = torch.default_generator
        torch_state = main.get_state()
        main.manual_seed(seed)
        try:
            return next(inner)
        finally:
            main.set_state(torch_state)
            self.missed = []
            for name, generator, seeded, before in started:
                drew = before is not None and generator.marker() != before
                if seeded or drew:
                    generator.restore()
                if drew:
                    self.drawn.add(name)
                    if not seeded:
                        self.missed.append(name)
