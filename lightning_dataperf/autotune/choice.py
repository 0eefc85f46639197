"""Autotune's answer from its trials: the cheapest as fast as the fastest, never worse than the policy's pick.

The rules and the budget kept for a close call are section 9 of docs/autotune.md.
"""

from __future__ import annotations

from lightning_dataperf.autotune.compare import Compare
from lightning_dataperf.autotune.trial import Trial

__all__ = ["CHOICE_RESERVE", "REFINE_ROUNDS", "choose"]

#: Most rounds of re-measuring a close call (each round measures both configurations once more).
REFINE_ROUNDS = 2
#: Share of the time budget the climb leaves for :func:`choose` to re-measure a close call, and the most it may take.
CHOICE_RESERVE = 0.3


def choose(
    compare: Compare, floor: Trial, choose_within: float, refine: int = REFINE_ROUNDS, seconds: float | None = None
) -> Trial:
    """The configuration to train with (``floor``, the policy's pick, when nothing beats it).

    ``seconds``: the most a close call's re-measurement may take (the search passes its reserve: a climb
    that ended early leaves budget, but a close call is not worth more than the share kept for it).

    Example::

        baseline = runner.measure(*policy_config)
        with runner.reserved(CHOICE_RESERVE * budget):
            ...                                  # climb, prefetch, pinning
        chosen = choose(compare, baseline, choose_within=0.02, seconds=CHOICE_RESERVE * budget)
    """
    if seconds is None:
        return _choose(compare, floor, choose_within, refine)
    with compare.runner.reserved(max(0.0, compare.runner.remaining - seconds)):
        return _choose(compare, floor, choose_within, refine)


def _choose(compare: Compare, floor: Trial, choose_within: float, refine: int) -> Trial:
    runner = compare.runner

    def cheaper(trial: Trial) -> tuple[int, bool, float]:  # fewer workers, the policy's pinning, less memory
        return trial.num_workers, trial.pin_memory != floor.pin_memory, trial.memory_mb

    chosen, refined, raced = floor, set(), False
    for round_index in range(refine + 1):
        measured = compare.measured()
        if not measured:
            return runner.latest(floor)
        top = max(measured, key=lambda trial: trial.batches_per_sec)
        contenders = [trial for trial in measured if compare.as_fast(trial, top)]
        chosen = min(contenders, key=cheaper)
        slower = chosen.batches_per_sec < top.batches_per_sec * (1 - choose_within)
        if slower and _same_cost(chosen, top):
            # only the queue's depth or the way sent differs: nothing a re-measurement could save
            chosen = top
        close = slower and chosen.measured_as != top.measured_as and not _other_pinning(chosen, top, floor)
        if not close and round_index == 0 and (rival := _unresolved_rival(compare, chosen, contenders, floor)):
            top, close, raced = rival, True, True  # one look each cannot order them: race the two, one round
        if not close:
            refined.clear()  # decided: the usual rules below
            break
        scale = _pair_scale(runner.remaining, (chosen, top), 2.0 ** (round_index + 1))
        if round_index == refine or scale is None or (raced and round_index > 0):
            if {chosen.measured_as, top.measured_as} <= refined:  # both re-measured, within noise: the means decide
                least = top.batches_per_sec * (1 - choose_within)
                chosen = min((trial for trial in measured if trial.batches_per_sec >= least), key=cheaper)
            break
        for trial in (chosen, top) if round_index % 2 == 0 else (top, chosen):
            before = runner.trials[trial.config]
            if runner.remeasure(before, cap_scale=scale) is not before:
                refined.add(trial.measured_as)  # measured again (not when the budget ran out, or the repeat was rough)
    floor = runner.latest(floor)
    if not floor.judged or floor.batches < 2 or chosen.measured_as == floor.measured_as:
        return chosen
    if _same_cost(chosen, floor) and compare.as_fast(floor, chosen):  # only the queue's depth or the way sent apart
        return chosen if chosen.batches_per_sec > floor.batches_per_sec else floor
    if {floor.measured_as, chosen.measured_as} <= refined and chosen.batches_per_sec > floor.batches_per_sec:
        return chosen  # the floor was one side of the close call, and measured slower
    if compare.faster(chosen, floor) or (cheaper(chosen) < cheaper(floor) and compare.as_fast(chosen, floor)):
        return chosen
    if _floor_against_a_confirmed_gain(compare, floor, chosen):
        # its one look is all that holds the gain back: again, the means decide
        floor = runner.remeasure(floor)
        # at the floor's workers only the pinning differs: the policy's still counts as the cheaper (noise, at least)
        gap = choose_within if chosen.num_workers != floor.num_workers else max(choose_within, compare.limits.noise)
        if floor.measurements > 1 and chosen.batches_per_sec > floor.batches_per_sec * (1 + gap):
            return chosen
    faster = [trial for trial in compare.measured() if compare.faster(trial, floor) and compare.as_fast(trial, top)]
    return min(faster, key=cheaper) if faster else floor


def _pair_scale(remaining: float, pair: tuple[Trial, Trial], wanted: float) -> float | None:
    """The trial-cap scale at which both sides of a close call fit in the ``remaining`` seconds: ``wanted`` where
    they do, less (both sides alike, at least one trial's cap) where they do not, ``None`` where not even that
    fits or nothing is left: half a pair decides nothing (one side measured again leaves the tie to the cheaper).

    Each side's time is its start-up plus its steady part times the scale, from its own measurements so far.
    """
    if remaining <= 0:
        return None
    start = steady = 0.0
    for trial in pair:
        began = max(0.0, trial.startup_s)  # -1: its workers were kept (no start-up)
        start += began
        steady += max(0.0, trial.seconds / max(1, trial.measurements) - began)
    if steady <= 0 or start + wanted * steady <= remaining:
        return wanted
    scale = (remaining - start) / steady
    return scale if scale >= 1.0 else None


def _unresolved_rival(compare: Compare, chosen: Trial, contenders: list[Trial], floor: Trial) -> Trial | None:
    """The fastest contender that costs more than ``chosen`` (more workers, or the other pinning where that is not
    all that differs: :func:`_other_pinning`) and read within ``noise`` of it or faster, both measured once: one
    trial each cannot tell which is faster.
    """
    least = chosen.batches_per_sec * (1 - compare.limits.noise)
    rivals = [
        trial
        for trial in contenders
        if trial.measured_as != chosen.measured_as and not _same_cost(trial, chosen)
        and not _other_pinning(chosen, trial, floor)
        and trial.measurements == 1 == chosen.measurements and trial.batches_per_sec >= least
    ]  # fmt: skip
    return max(rivals, key=lambda trial: trial.batches_per_sec, default=None)


def _floor_against_a_confirmed_gain(compare: Compare, floor: Trial, chosen: Trial) -> bool:
    """``chosen`` was measured more than once and is still faster than ``floor`` (measured once) by more than
    ``noise``, but not beyond the two rates' combined error, and the budget has time for one more look (asked
    where ``chosen`` is not the cheaper: the rules before it take a cheaper one as fast). Measured again, the
    floor gives way where ``chosen``'s mean is ``choose_within`` above its own, or, at the same workers (only the
    pinning apart), ``noise`` above it. A repeat that measured nothing leaves the floor.
    """
    if chosen.measurements < 2 or floor.measurements != 1 or compare.runner.remaining <= 0:
        return False
    return compare.ahead(chosen, floor) and not compare.faster(chosen, floor)


def _other_pinning(kept: Trial, other: Trial, floor: Trial) -> bool:
    """``other`` has ``kept``'s workers (not 0) and the other pinning, ``kept`` the policy's (``floor``'s): the
    policy's pinning stands unless the other is faster beyond noise, unmeasured again.

    With workers the pinning is done off the main thread, and one trial each cannot order pinned against unpinned
    (``benchmarks/pin_pairs.py``). Without workers the main thread pins every batch itself, and such a call is
    measured again as any other.
    """
    same_workers = bool(kept.num_workers) and kept.num_workers == other.num_workers
    return same_workers and kept.pin_memory == floor.pin_memory != other.pin_memory


def _same_cost(first: Trial, second: Trial) -> bool:
    """The same workers and pinning: only the queue's depth (memory the guard allowed) or the way sent apart."""
    return (first.num_workers, first.pin_memory) == (second.num_workers, second.pin_memory)
