"""Seeded batches in the training process: each batch's draws keyed by its number, the user's generators untouched."""

from __future__ import annotations

import random

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf.loader.main_rng import MainGenerators, _NumpyRaw, _PythonRaw, _PythonState
from lightning_dataperf.loader.seeding import batch_seed, seed_batches_in_main_process


class _Draws(Dataset):
    """Each sample: a draw from each generator the test names."""

    def __init__(self, which: tuple[str, ...]) -> None:
        self.which = which

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> torch.Tensor:
        values = [float(index)]
        if "numpy" in self.which:
            values.append(float(numpy.random.standard_normal()))
        if "random" in self.which:
            values.append(random.random())
        if "torch" in self.which:
            values.append(float(torch.rand(())))
        return torch.tensor(values)


def _user_draws() -> tuple[float, float, float]:
    return float(numpy.random.standard_normal()), random.random(), float(torch.rand(()))


@pytest.mark.parametrize("which", [(), ("numpy",), ("random", "torch"), ("numpy", "random", "torch")])
@pytest.mark.parametrize("cached_normal", [False, True])
def test_the_user_generators_draw_as_if_no_batch_was_loaded(which, cached_normal):
    """Between batches the user draws from every generator (a normal cached or not): the user's draws and the
    batches' are those of an untouched process and of batches seeded by their number, whatever ``which`` draws."""

    def run(loaded: bool) -> tuple[list, list]:
        numpy.random.seed(5), random.seed(5), torch.manual_seed(5)
        if cached_normal:
            numpy.random.standard_normal()  # one of a pair: the second waits in the cache (has_gauss)
        loader = DataLoader(_Draws(which), batch_size=3)
        seed_batches_in_main_process(loader, 11, 0, lambda: (0, 0))
        batches, user = [], []
        iterator = iter(loader)
        for _ in range(4):
            if loaded:
                batches.append(next(iterator))
            user.append(_user_draws())
        return batches, user

    batches, user = run(True)
    _, untouched = run(False)
    assert user == untouched
    for number, batch in enumerate(batches):
        # the batch alone, drawn from its own seed in a fresh process state: the same values
        seed = batch_seed(11, 0, 0, number)
        numpy.random.seed(seed % 2**32), random.seed(seed), torch.default_generator.manual_seed(seed)
        expected = torch.stack([_Draws(which)[index] for index in range(3 * number, 3 * number + 3)])
        assert torch.equal(batch, expected)


def test_numpy_words_are_read_in_place_and_an_unknown_layout_falls_back_to_the_full_state():
    raw = _NumpyRaw.of(numpy)
    assert raw is not None, "numpy's MT19937 layout as checked: the fast path is in use here"
    numpy.random.seed(3)
    words = raw.read()
    numpy.random.random()
    assert raw.read() != words
    raw.write(words)
    assert numpy.random.get_state()[2] == 624  # just seeded: the position before any draw
    generators = MainGenerators()
    generators.raw = None  # as where the layout check failed: main_process_seeded's full save and restore
    numpy.random.seed(3)
    first = numpy.random.random()
    numpy.random.seed(3)
    assert generators.fetch(7, iter([1])) == 1 and numpy.random.random() == first


def test_each_batchs_load_time_is_reported_where_asked():
    seen: list[float] = []
    loader = DataLoader(_Draws(("torch",)), batch_size=3)
    seed_batches_in_main_process(loader, 11, 0, lambda: (0, 0), fetched=seen.append)
    assert len(list(loader)) == 4 and len(seen) == 4 and all(seconds > 0 for seconds in seen)


def test_pythons_words_are_copied_in_place_with_its_cached_normal_and_an_unknown_layout_falls_back():
    assert _PythonRaw.of() is not None, "CPython's layout as checked: the fast path is in use here"
    random.seed(5)
    random.gauss(0, 1)  # the second normal of the pair is cached (gauss_next): the user's next gauss reads it
    users = random.getstate()
    random.seed(7)
    seeded = [random.gauss(0, 1), random.random()]
    random.setstate(users)
    after = [random.gauss(0, 1), random.random()]

    def draws():
        while True:
            yield [random.gauss(0, 1), random.random()]

    for fast in (True, False):
        generators = MainGenerators()
        if not fast:
            generators.python = _PythonState()  # as where the layout check failed: getstate and setstate
        random.setstate(users)
        assert generators.fetch(7, draws()) == seeded, "the batch draws from its own seed, not the cached normal"
        assert [random.gauss(0, 1), random.random()] == after, "the user's stream, cached normal included, is back"
