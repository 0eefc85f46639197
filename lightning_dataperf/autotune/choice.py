"""Autotune's answer from its trials: the cheapest as fast as the fastest, never worse than the policy's pick.

:func:`choose` takes the measured trials of a :class:`~lightning_dataperf.autotune.search.Search`:

* the contenders are the trials as fast as the fastest within noise (``noise``, or twice the two rates'
  combined standard error); the cheapest of them wins (fewer workers, less memory, no pinning);
* a close call (the cheapest contender more than ``choose_within`` below the fastest, but within noise)
  is measured again, both configurations interleaved, each time twice as long and twice as precise,
  until it is decided or ``refine`` rounds are spent. Still undecided after at least one such round, the
  re-measured means decide: the fastest, unless the cheaper is within ``choose_within`` of it (the
  cheaper would give up more throughput than the user's tolerance on the best estimate there is). Not
  re-measured at all (the time budget was spent), the tie goes to the cheaper. A round the budget cannot fit
  at twice the cap is measured shorter, both sides alike, or not at all (:func:`_pair_scale`). Where the two
  have the same workers and pinning (only the queue's depth, a little memory the guard allowed, or the way the
  workers send differs), the faster is taken as measured: there is no worker or pinned buffer to save, and on the
  2-core VM re-measuring such a call (66 workers, prefetch 2 against 4, 9% apart) took 9.6 s of a 28-s search;
* a costlier contender (more workers, or the other pinning) that read within ``noise`` of the cheapest, or
  faster, each measured once, is raced against it the same way, one round (:func:`_unresolved_rival`): one
  short trial each cannot order settings 5-10% apart, and without the race the tie always went to the
  cheaper (on the H200, JPEG -> ResNet-18, stock copy: 18 workers 8% above the policy's 15 over ten
  trials each, where one trial of each read 15 1% ahead);
* the policy's pick (measured first) is the floor: it is replaced by a configuration faster beyond
  noise, by a cheaper one as fast, or, when it was one of a re-measured close call, by the faster mean;
  a costlier pick measured twice and still faster by more than ``noise`` (but within the two rates' error) has
  the floor's one look measured again, and the means decide (:func:`_floor_against_a_confirmed_gain`).
  Between two settings as fast with the same workers, the policy's pinning counts as the cheaper (then
  less memory), so the other pinning at the floor's workers must be faster beyond noise to replace it:
  pinning costs only the memory the guard allows, and one trial each cannot tell the two apart (on the
  H200, JPEG -> ResNet-18 at 15-18 workers, unpinned against pinned read +21%, tie, tie, -11% and -17% in
  five calls; a tie taken for the unpinned copy re-measured 14% below the policy's pinned one). A close call that
  is only the other pinning at the same workers is not measured again (:func:`_other_pinning`).

:data:`CHOICE_RESERVE` of the time budget is kept from the climb for that re-measurement: a search that
spent its budget climbing could not resolve the one comparison its answer depends on (measured on the
H200: 18 workers read 7.7% faster than the policy's 15, within that trial's 11% error, and with no
time left the tie went to 15, 13% below the grid's best).

Example::

    baseline = runner.measure(*policy_config)
    with runner.reserved(CHOICE_RESERVE * budget):
        ...                                  # climb, prefetch, pinning
    chosen = choose(compare, baseline, choose_within=0.02, seconds=CHOICE_RESERVE * budget)
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
    that ended early leaves budget, but a close call is not worth more than the share kept for it; on the
    2-core VM the refinement of prefetch 2 against 4 at 3 workers, 3% apart, took 20 s of a 30-s budget).
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
            chosen = top  # only the queue's depth or the way sent differs: nothing a re-measurement could save
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
    if compare.better(chosen, floor) or (cheaper(chosen) < cheaper(floor) and compare.as_fast(chosen, floor)):
        return chosen
    if _floor_against_a_confirmed_gain(compare, floor, chosen):
        floor = runner.remeasure(floor)  # its one look is all that holds the gain back: again, the means decide
        # at the floor's workers only the pinning differs: the policy's still counts as the cheaper (noise, at least)
        gap = choose_within if chosen.num_workers != floor.num_workers else max(choose_within, compare.limits.noise)
        if floor.measurements > 1 and chosen.batches_per_sec > floor.batches_per_sec * (1 + gap):
            return chosen
    faster = [trial for trial in compare.measured() if compare.better(trial, floor) and compare.as_fast(trial, top)]
    return min(faster, key=cheaper) if faster else floor


def _pair_scale(remaining: float, pair: tuple[Trial, Trial], wanted: float) -> float | None:
    """The trial-cap scale at which both sides of a close call fit in the ``remaining`` seconds: ``wanted`` where
    they do, less (both sides alike, at least one trial's cap) where they do not, ``None`` where not even that
    fits or nothing is left: half a pair decides nothing (one side measured again leaves the tie to the cheaper).

    Each side's time is its start-up plus its steady part times the scale, from its own measurements so far. On
    the H200 (JPEG -> ResNet-18, side stream) a round at twice the cap re-measured the policy's 15 workers in
    5.5 s of the 9 s left, and the budget cut 18 workers' repeat before one steady round: the tie went to 15
    (18 had read 3% faster twice), 87% of the grid's best.
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

    Measured on the H200 (JPEG -> ResNet-18, stock copy; ``benchmarks/trial_noise.py``, ten fresh trials of
    each): 18 workers pinned made 38.0 batches/s and the policy's 15 35.2 (8% apart), where single trials
    of 3-4 s have a 5-8% standard error; in a search 18 read 1% below 15, the climb stopped there, and the pick
    re-measured 89% of the grid's best.
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

    Measured on the H200 (JPEG -> ResNet-18, side stream): 18 workers read 39.3 and 41.1 batches/s (6.2% error),
    the policy's 15 read 36.0 once (2.7%): the climb confirmed 18 (+12%), the floor rule asked +14% and kept 15,
    98.2% of the grid's best.
    """
    if chosen.measurements < 2 or floor.measurements != 1 or compare.runner.remaining <= 0:
        return False
    return compare.faster_by_noise(chosen, floor) and not compare.better(chosen, floor)


def _other_pinning(kept: Trial, other: Trial, floor: Trial) -> bool:
    """``other`` has ``kept``'s workers (not 0) and the other pinning, ``kept`` the policy's (``floor``'s): the
    policy's pinning stands unless the other is faster beyond noise, unmeasured again. With workers the pinning is
    done off the main thread, and a pinning call within noise is noise: on the H200 (4 cores, CPU-heavy transform)
    the grid read 6 workers pinned 51.0-62.3 batches/s and unpinned 46.1-57.2, and re-measuring a +4% call for
    the unpinned copy at 5 workers took 8.9 s of a 21.4-s search; on JPEG -> ResNet-18 at 15-18 workers unpinned
    against pinned read +21%, tie, tie, -11% and -17% in five calls; over six stock-copy grids (tiny, cpu, JPEG)
    the same point unpinned against pinned had a median of 0.95-1.02, pairs either way (``benchmarks/pin_pairs.py``).
    Without workers the main thread pins every batch itself, and such a call is measured again as any other (the
    H200 tiny row: 0 workers unpinned read 384-386 against pinned 367-375 in every look).
    """
    same_workers = bool(kept.num_workers) and kept.num_workers == other.num_workers
    return same_workers and kept.pin_memory == floor.pin_memory != other.pin_memory


def _same_cost(first: Trial, second: Trial) -> bool:
    """The same workers and pinning: only the queue's depth (memory the guard allowed) or the way sent apart."""
    return (first.num_workers, first.pin_memory) == (second.num_workers, second.pin_memory)
