"""Seeded batches in the training process: each batch's draws keyed by its number, the user's generators untouched."""

from __future__ import annotations

import random

import numpy
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf.loader.main_rng import (
    LEARNING_FETCHES,
    MainGenerators,
    _NumpyRaw,
    _NumpyState,
    _PythonRaw,
    _PythonState,
    numpy_key,
    rng_restored,
)
from lightning_dataperf.loader.seeding import (
    UNSEEDED_DRAW,
    batch_seed,
    seed_batches_in_main_process,
    seed_everything_here,
)

#: Enough batches that the generators no batch drew from are left unseeded for some of them.
_BATCHES = LEARNING_FETCHES + 6


class _Draws(Dataset):
    """Each sample: a draw from each generator the test names."""

    def __init__(
        self, which: tuple[str, ...], length: int = 12, late: tuple[str, ...] = (), from_index: int = 0
    ) -> None:
        self.which, self.length, self.late, self.from_index = which, length, late, from_index

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        values = [float(index)]
        if index >= self.from_index and "random" in self.late:
            values.append(random.random())
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
    batches' are those of an untouched process and of batches seeded by their number, whatever ``which`` draws,
    also after the learning batches, where a generator none of them drew from is no longer seeded."""

    def run(loaded: bool) -> tuple[list, list]:
        numpy.random.seed(5), random.seed(5), torch.manual_seed(5)
        if cached_normal:
            numpy.random.standard_normal()  # one of a pair: the second waits in the cache (has_gauss)
        loader = DataLoader(_Draws(which, length=3 * _BATCHES), batch_size=3)
        seed_batches_in_main_process(loader, 11, 0, lambda: (0, 0))
        batches, user = [], []
        iterator = iter(loader)
        for _ in range(_BATCHES):
            if loaded:
                batches.append(next(iterator))
            user.append(_user_draws())
        return batches, user

    batches, user = run(True)
    _, untouched = run(False)
    assert len(batches) == _BATCHES and user == untouched
    for number, batch in enumerate(batches):
        # the batch alone, drawn from its own seed in a fresh process state: the same values
        seed = batch_seed(11, 0, 0, number)
        numpy.random.seed(numpy_key(seed)), random.seed(seed), torch.default_generator.manual_seed(seed)
        expected = torch.stack([_Draws(which)[index] for index in range(3 * number, 3 * number + 3)])
        assert torch.equal(batch, expected)


def test_torch_and_numpy_draw_independently_in_a_seeded_batch():
    """Both seed a Mersenne Twister from 32 bits: NumPy's key differs from torch's, so a sample that flips one
    coin with each (a crop from one, a flip from the other) does not get the same flip twice."""
    flips = 64

    class Coins(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> torch.Tensor:
            numpys = torch.from_numpy(numpy.random.randint(0, 2, flips))
            return torch.stack([torch.randint(0, 2, (flips,)), numpys])

    loader = DataLoader(Coins(), batch_size=1)
    seed_batches_in_main_process(loader, 3, 0, lambda: (0, 0))
    for batch in loader:
        torchs, numpys = batch[0]
        assert not torch.equal(torchs, numpys), "seeded alike, the two generators would flip the same coins"
    for seed in (0, 1, 2**32 - 1, 2**32, batch_seed(3, 0, 0, 0)):
        assert numpy_key(seed) != seed & 0xFFFFFFFF and 0 <= numpy_key(seed) < 2**32
        with rng_restored(cuda=False):
            seed_everything_here(seed)  # what a worker does for each seeded batch
            assert not torch.equal(torch.randint(0, 2, (flips,)), torch.from_numpy(numpy.random.randint(0, 2, flips)))


@pytest.mark.parametrize("fast", [True, False])
def test_numpys_words_are_copied_in_place_with_its_cached_normal_and_an_unknown_layout_falls_back(fast):
    assert _NumpyRaw.of(numpy) is not None, "numpy's layout as checked: the fast path is in use here"
    numpy.random.seed(5)
    numpy.random.standard_normal()  # the second normal of the pair is cached (has_gauss): the user's next reads it
    users = numpy.random.get_state()
    numpy.random.seed(numpy_key(7))
    seeded = [numpy.random.standard_normal(), numpy.random.random()]
    numpy.random.set_state(users)
    after = [numpy.random.standard_normal(), numpy.random.random()]

    def draws():
        while True:
            yield [numpy.random.standard_normal(), numpy.random.random()]

    generators = MainGenerators()
    if not fast:
        generators.watched[1] = ("numpy", _NumpyState(numpy))  # as where the layout check failed
    numpy.random.set_state(users)
    assert generators.fetch(7, draws()) == seeded, "the batch draws from its own seed, not the cached normal"
    assert [numpy.random.standard_normal(), numpy.random.random()] == after, "the user's stream is back"


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
            generators.watched[0] = ("random", _PythonState())  # as where the layout check failed
        random.setstate(users)
        assert generators.fetch(7, draws()) == seeded, "the batch draws from its own seed, not the cached normal"
        assert [random.gauss(0, 1), random.random()] == after, "the user's stream, cached normal included, is back"


def test_generators_no_learning_batch_drew_from_are_left_unseeded_and_a_late_draw_is_reported(monkeypatch):
    """After the learning batches ``random`` is seeded no more where none drew from it; a batch that then draws
    from it is reported (drawn unseeded, the user's stream put back), and every later batch is seeded again."""
    seeds: list[int] = []
    seed = random.seed
    monkeypatch.setattr(random, "seed", lambda value=None: (seeds.append(value), seed(value))[1])
    late = LEARNING_FETCHES + 2
    loader = DataLoader(_Draws(("torch",), length=_BATCHES, late=("random",), from_index=late), batch_size=1)
    seed_batches_in_main_process(loader, 11, 0, lambda: (0, 0))
    seed(5)
    users = random.getstate()
    with pytest.warns(UserWarning) as caught:
        batches = list(loader)
    assert random.getstate() == users, "the unseeded draw came from the user's stream, which is put back"
    messages = [str(warning.message) for warning in caught]
    assert messages == [UNSEEDED_DRAW.format(name="random", batch=late, epoch=0)]
    # seeded for the learning batches, not in between, and again from the batch after the late draw (up to the
    # call that finds the epoch's end)
    expected = [*range(LEARNING_FETCHES), *range(late + 1, _BATCHES + 1)]
    assert seeds == [batch_seed(11, 0, 0, number) for number in expected]
    for number in [*range(late), *range(late + 1, _BATCHES)]:
        seed(batch_seed(11, 0, 0, number)), torch.default_generator.manual_seed(batch_seed(11, 0, 0, number))
        assert torch.equal(batches[number][0], _Draws(("torch",), late=("random",), from_index=late)[number])


def test_numpy_no_learning_batch_drew_from_is_watched_and_a_late_draw_is_reported():
    """The same for NumPy, whose words are compared in place: the user's state (cached normal included) is back."""

    class LateNumpy(_Draws):
        def __getitem__(self, index: int) -> torch.Tensor:
            drawn = numpy.random.standard_normal() if index == LEARNING_FETCHES + 1 else 0.0
            return torch.tensor([float(index), float(drawn)])

    generators = MainGenerators()
    numpy.random.seed(3)
    numpy.random.standard_normal()  # a cached normal: every batch is seeded while the user holds one
    numpy.random.standard_normal()  # the pair used up: no cached normal
    users = numpy.random.get_state()
    dataset = LateNumpy(())
    missed = []
    for number in range(_BATCHES):
        generators.fetch(number, (dataset[index] for index in [number]))
        missed.append(generators.missed)
    assert missed == [["numpy"] if number == LEARNING_FETCHES + 1 else [] for number in range(_BATCHES)]
    after = numpy.random.get_state()
    assert after[0] == users[0] and (after[1] == users[1]).all() and after[2:] == users[2:]


@pytest.mark.parametrize("fast", [True, False])
def test_every_generator_is_put_back_also_when_the_fetch_raises(fast):
    generators = MainGenerators()
    if not fast:
        generators.watched = [("random", _PythonState()), ("numpy", _NumpyState(numpy))]
    before = (random.getstate(), torch.get_rng_state(), numpy.random.get_state())

    def raising():
        random.random(), torch.rand(1), numpy.random.standard_normal()
        raise KeyError("restored also when the fetch raises")
        yield

    with pytest.raises(KeyError):
        generators.fetch(batch_seed(5, 1, 0, 3), raising())
    after = numpy.random.get_state()
    assert random.getstate() == before[0] and torch.equal(torch.get_rng_state(), before[1])
    assert (after[1] == before[2][1]).all() and after[2:] == before[2][2:]
