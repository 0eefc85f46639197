"""Faster, ahead, as fast, slower for sure: the one vocabulary of rate comparisons the search and the loop share."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = [
    "DECIDED_GAP",
    "DECIDED_SE",
    "LOOKS_DECIDE",
    "LOOKS_FLOOR",
    "LOOKS_SE",
    "TIE_BAND",
    "TURNS_DECIDE",
    "ahead",
    "as_fast",
    "as_fast_in_turns",
    "faster",
    "faster_in_looks",
    "faster_in_turns",
    "gap",
    "lead_in_turns",
    "no_lead_in_turns",
    "slower_for_sure",
]

#: A compared trial stops once slower by this share (the tie band) plus :data:`DECIDED_SE` combined standard
#: errors: more batches could not change what the search does with it.
DECIDED_GAP = 0.1
#: Standard errors beyond :data:`DECIDED_GAP` a decided trial must be (3: about one in a thousand by chance).
DECIDED_SE = 3.0
#: Most a tie may span: past this share slower it is slower, whatever a large standard error says.
TIE_BAND = DECIDED_GAP
#: Looks of each of two settings, taken in turn, from which their spread may decide a lead below the noise floor.
LOOKS_DECIDE = 3
#: The least lead the looks decide: on the tiny pipeline, 2 cores, 0 workers + 1 thread read 2.4-2.9% ahead of 2
#: threads in each of three looks (±0.3% between looks), 5-8% in the grid, and the 3% floor kept 2 threads.
LOOKS_FLOOR = 0.01
#: Standard errors of the difference of the looks' means a lead must exceed (by chance: one in a thousand for a
#: normal spread; with three looks a setting, Student's t, one in 20 to 50).
LOOKS_SE = 3.0
#: Looks of a neighbour, each beside the incumbent's on either side, from which :func:`faster_in_turns` decides (at
#: three, Student's t passes 3 standard errors one time in 20 by chance; at five, one in 50 for one check). The
#: search checks again after every look up to its 13th, and neighbouring leads share an incumbent look: simulated
#: with 3% noise a look, a neighbour as fast as the incumbent was kept in 8% of searches (4% before the turns), one
#: 2% slower in about 1%, one 4% faster in 80-84% (30-38% before).
TURNS_DECIDE = 5


def gap(error: float, other: float, noise: float) -> float:
    """Relative difference two rates (relative standard errors ``error`` and ``other``) must exceed to differ:
    ``noise``, or twice their combined standard error when that is larger (a noisy pair needs a bigger gap).

    Example::

        gap(0.03, 0.03, 0.03)  # 0.085: one look each at 3% error cannot call an 8% lead
    """
    # twice the combined error: a real difference of that size reads as one about 19 times in 20
    return max(noise, 2 * math.hypot(error, other))


def faster(rate: float, than: float, by: float) -> bool:
    """``rate`` faster than ``than`` beyond ``by`` (a :func:`gap`)."""
    return rate > than * (1 + by)


def ahead(rate: float, than: float, noise: float) -> bool:
    """Ahead by more than the noise floor alone, whatever the errors: worth a closer look if not :func:`faster`."""
    return rate > than * (1 + noise)


def as_fast(rate: float, than: float, by: float) -> bool:
    """Not slower than ``than`` by more than ``by``: a tie goes either way."""
    return rate >= than * (1 - by)


def slower_for_sure(rate: float, error: float, than: float, than_error: float) -> bool:
    """So far behind ``than`` that no longer measurement could make it a tie: slower by more than
    :data:`DECIDED_GAP` plus :data:`DECIDED_SE` combined standard errors (``False`` where an error is unknown).

    Example::

        slower_for_sure(10.0, 0.1, 40.0, 0.05)  # True: a quarter of the rate
    """
    combined = math.hypot(error, than_error)
    if not math.isfinite(combined) or than <= 0:
        return False
    return rate / than - 1 < -(DECIDED_GAP + DECIDED_SE * combined)


def faster_in_looks(looks: Sequence[tuple[float, float]], than: Sequence[tuple[float, float]]) -> bool:
    """Looks ``(rate, relative error)`` of one setting faster than those of another, taken in turn: at least
    :data:`LOOKS_DECIDE` of each, the mean rate ahead by more than :data:`LOOKS_FLOOR` and by more than
    :data:`LOOKS_SE` standard errors of the difference, each setting's spread the larger of its looks' spread and
    their own errors (a drift between the looks counts as spread, so it cannot make a lead).

    Example::

        faster_in_looks([(1365, 0.003), (1363, 0.003), (1368, 0.003)], [(1326, 0.005), (1329, 0.005), (1336, 0.005)])
    """
    if min(len(looks), len(than)) < LOOKS_DECIDE:
        return False
    mean, other = statistics.fmean(rate for rate, _ in looks), statistics.fmean(rate for rate, _ in than)
    if other <= 0 or not mean / other - 1 > LOOKS_FLOOR:
        return False

    def variance(reads: Sequence[tuple[float, float]]) -> float:
        within = statistics.fmean((rate * error) ** 2 for rate, error in reads)
        return max(statistics.variance([rate for rate, _ in reads]), within) / len(reads)

    standard = math.sqrt(variance(looks) + variance(than))
    return math.isfinite(standard) and mean - other > LOOKS_SE * standard


def lead_in_turns(turns: Sequence[tuple[bool, float]]) -> tuple[float, float, int]:
    """Looks ``(is the neighbour, rate)`` in the order taken: the neighbour's mean lead over the incumbent, its
    standard error, and the looks it is read from. Each neighbour look is set against the mean of the incumbent's
    looks right before and after it (one where it has a single side, as the first has), so a drift of the step
    that is slow beside a look cancels, a linear one too for every look with both sides.

    Example::

        lead_in_turns([(True, 104), (False, 100), (True, 95), (False, 91), (True, 99)])  # (0.041, 0.027, 3)
    """
    leads = []
    for index, (neighbour, rate) in enumerate(turns):
        if not neighbour:
            continue
        beside = [turns[i][1] for i in (index - 1, index + 1) if 0 <= i < len(turns) and not turns[i][0]]
        if beside and min(beside) > 0:
            leads.append(rate / statistics.fmean(beside) - 1)
    if not leads:
        return 0.0, math.inf, 0
    spread = statistics.stdev(leads) if len(leads) > 1 else math.inf
    return statistics.fmean(leads), spread / math.sqrt(len(leads)), len(leads)


def faster_in_turns(turns: Sequence[tuple[bool, float]]) -> bool:
    """The neighbour faster than the incumbent in looks taken in turn (:func:`lead_in_turns`): at least
    :data:`TURNS_DECIDE` of its looks, its mean lead above :data:`LOOKS_FLOOR` and :data:`LOOKS_SE` standard errors.

    Example::

        faster_in_turns([(True, 104), (False, 100), (True, 97), (False, 92), (True, 99), (False, 96)] * 2)
    """
    lead, error, looks = lead_in_turns(turns)
    return looks >= TURNS_DECIDE and lead > LOOKS_FLOOR and lead > LOOKS_SE * error


def as_fast_in_turns(turns: Sequence[tuple[bool, float]], floor: float) -> bool:
    """In looks taken in turn, the neighbour behind by less than ``floor`` beyond doubt: at least
    :data:`TURNS_DECIDE` neighbour looks, the mean lead two standard errors above ``-floor``."""
    lead, error, looks = lead_in_turns(turns)
    return looks >= TURNS_DECIDE and lead - 2 * error > -floor


def no_lead_in_turns(turns: Sequence[tuple[bool, float]], floor: float) -> bool:
    """In looks taken in turn, no lead above ``floor`` is left to find: at least :data:`TURNS_DECIDE` neighbour
    looks, the mean lead two standard errors under it."""
    lead, error, looks = lead_in_turns(turns)
    return looks >= TURNS_DECIDE and lead + 2 * error < floor
