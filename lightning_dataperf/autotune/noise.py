"""Faster, ahead, as fast, slower for sure: the one vocabulary of rate comparisons the search and the loop share."""

from __future__ import annotations

import math

__all__ = ["DECIDED_GAP", "DECIDED_SE", "TIE_BAND", "ahead", "as_fast", "faster", "gap", "slower_for_sure"]

#: A compared trial stops once slower by this share (the tie band) plus :data:`DECIDED_SE` combined standard
#: errors: more batches could not change what the search does with it.
DECIDED_GAP = 0.1
#: Standard errors beyond :data:`DECIDED_GAP` a decided trial must be (3: about one in a thousand by chance).
DECIDED_SE = 3.0
#: Most a tie may span: past this share slower it is slower, whatever a large standard error says.
TIE_BAND = DECIDED_GAP


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
