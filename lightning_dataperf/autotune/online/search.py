"""The online loop's search: which neighbour of the kept setting to measure next, and when one wins."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Sequence

from lightning_dataperf.autotune.noise import (
    ahead,
    as_fast,
    as_fast_in_turns,
    faster,
    faster_in_looks,
    faster_in_turns,
    gap,
    lead_in_turns,
    no_lead_in_turns,
    slower_for_sure,
)
from lightning_dataperf.autotune.online.records import Measured, Setting, SettingSpace, counted

__all__ = [
    "CLOSE_CALL_MARGIN", "CLOSE_CALL_ROUNDS", "CONFIRM_BELOW", "TURNS_ROUNDS", "WORKERS_TIE",
    "NeighbourSearch", "Phase",
]  # fmt: skip


class Phase(enum.Enum):
    """Where the loop stands: what the setting in use is being measured for."""

    START = "measuring the setting it starts from"
    TRYING = "trying a neighbour against the setting in use"
    CLOSE_CALL_INCUMBENT = "a close call: the setting in use measured again"
    CLOSE_CALL_NEIGHBOUR = "a close call: the neighbour measured again"
    CONFIRMING = "the setting in use measured again before a faster neighbour is kept"
    WATCHING = "decided: the kept setting's step rate watched for drift"
    DONE = "done: the kept setting stays"


#: What the search asks for: the setting to measure next and the measurement a trial may be cut against.
Ask = tuple[Setting, Measured | None]

#: A neighbour faster than this is kept without measuring the setting in use again (each look costs a switch:
#: on the H200 a switch of 8-16 JPEG workers stalled training for seconds).
CONFIRM_BELOW = 0.25

#: A neighbour ahead by more than the noise floor but not beyond its error is measured this many times more
#: (each time beside the incumbent again): benchmarks/online.py's quickstart, 2 cores, kept 3 workers at 8%
#: below 4 with one look at each.
CLOSE_CALL_ROUNDS = 2

#: A close call's looks are measured until the pooled pair would decide a lead this many times smaller than the
#: one read: the tokeniser pipeline's 2 and 4 workers (4-6% apart) read ±3% a look, and 2 looks of each at the
#: loop's own precision left 4 of 10 runs below 4 workers (benchmarks/README.md, the online loop).
CLOSE_CALL_MARGIN = 1.15

#: The finest error a close call's look is asked for, as a share of the loop's own precision: 2% at its 3%, about
#: twice a trial's batches, so that the looks fit a run of a minute (at 1.5%, a simulated 60-s tokeniser run
#: ended mid-search in a third of runs); a coarse precision of your own keeps its looks coarse too.
CLOSE_CALL_FINEST = 2 / 3

#: Rounds of looks in turn for a neighbour that differs from the incumbent in intra-op threads alone: that switch
#: restarts nothing, so the two are looked at in turn at the loop's own precision and each neighbour look is set
#: against the incumbent's beside it (``noise.lead_in_turns``). On the dicts pipeline, 2 cores, 1 thread led 2
#: by 4% in the grid while the step moved 10-15% between looks: three looks of each kept either in 6 of 10 runs.
TURNS_ROUNDS = 12

#: A neighbour with fewer workers is kept on a tie when, after its close call, its pooled looks read no further
#: behind the incumbent's than this share of the noise floor (1.5% at the loop's 3%).
WORKERS_TIE = 0.5


class NeighbourSearch:
    """Coordinate search over ``space`` from ``start``, one measurement at a time; :attr:`kept` once :attr:`phase`
    is :attr:`Phase.DONE`.

    A neighbour that reads faster beyond noise (or, in :data:`~lightning_dataperf.autotune.noise.LOOKS_DECIDE`
    looks of each, steadily ahead by their spread), by less than :data:`CONFIRM_BELOW`, is kept only after the
    incumbent, measured again right after it, still reads slower (so a drifting step rate cannot make a setting
    look faster). A neighbour ahead by less than its error is a close call: both are measured again, up to
    :data:`CLOSE_CALL_ROUNDS` times; one behind by less than its error, read by a noisy look, is measured again
    where it stands, the new look replacing the noisy one. A kept neighbour starts the search again from it; the
    search ends when none of the kept setting's neighbours wins.

    Example::

        search = NeighbourSearch(Setting(0, None, False, 2), SettingSpace(4, 2, True, False))
        while search.phase is not Phase.DONE:
            setting, against = search.ask
            search.measured(measure(setting, against))
        search.kept
    """

    def __init__(self, start: Setting, space: SettingSpace, noise: float = 0.03) -> None:
        # 3%, autotune_loader's default noise too: the search and the loop call the same lead faster
        self.space, self.noise = space, noise
        self.phase = Phase.START
        self.ask: Ask = (start, None)
        """The setting to measure next, and the measurement it is compared with (``None``: the incumbent itself)."""
        self.best: Measured | None = None
        """The incumbent: the setting the search stands on, as measured so far."""
        self.kept: Measured | None = None
        self._tried, self._start = {start}, start
        self._neighbours: Iterator[Setting] = iter(())
        self._trial: Measured | None = None
        self._rounds = 0
        self.first: Sequence[Setting] = ()
        """The moves to try first from the start (what its measured facts point to); set before it is measured."""
        self.lead: Measured | None = None
        """A neighbour that read ahead of the incumbent, not yet confirmed (too few batches, or within its error)."""
        self.precision: float | None = None
        """The error :attr:`ask`'s measurement must reach where a close call needs more than the loop's own."""
        self._again = False
        """The neighbour on trial is measured again where it stands: its look replaces the blurred one."""
        self._relooked = False
        """The incumbent's noisy look was taken again for the neighbour on trial (once a neighbour)."""
        self.turns: list[tuple[bool, float]] = []
        """The looks at the neighbour on trial and the incumbent, ``(is the neighbour, rate)``, in the order taken."""
        self.ties: list[str] = []
        """Ties settled for fewer threads or fewer workers, in words (the summary's notes)."""
        self._worker_tie = False

    def measured(self, measured: Measured) -> Phase:
        """Takes the measurement of :attr:`ask`'s setting; the phase it moves to (a new :attr:`ask` unless done)."""
        phase, best, trial = self.phase, self.best, self._trial
        if phase in (Phase.CONFIRMING, Phase.CLOSE_CALL_INCUMBENT) and self._look_again(measured):
            return self.phase
        if phase is not Phase.START:
            self._turn(phase, measured)
        if phase is Phase.START:
            self._climb_from(measured)
        elif phase is Phase.TRYING:
            self._judge(measured)
        elif phase is Phase.CLOSE_CALL_INCUMBENT:
            assert best is not None
            self.best = best.pooled(measured)
            assert trial is not None
            if self._in_turns(trial, self.best):
                self._judge_in_turns(trial, self.best)
            else:
                self._ask(Phase.CLOSE_CALL_NEIGHBOUR, self._neighbour(), self.best, _look_precision(trial, self.best))
        elif phase is Phase.CLOSE_CALL_NEIGHBOUR:
            assert trial is not None
            self._rounds += 1
            again, self._again = self._again, False
            self._judge(measured if again else trial.pooled(measured))
        elif phase is Phase.CONFIRMING:
            assert best is not None and trial is not None
            self.best = reference = best.pooled(measured)
            if self._faster(trial, reference):
                self._climb_from(trial)
            elif self._in_turns(trial, reference):
                self._judge_in_turns(trial, reference)
            elif self._rounds < CLOSE_CALL_ROUNDS and (
                ahead(trial.steps_per_sec, reference.steps_per_sec, 0.0) or self._tied_fewer(trial, reference)
            ):
                # the incumbent's second look closed the gap, the neighbour still ahead or fewer workers tied
                self._ask(Phase.CLOSE_CALL_NEIGHBOUR, trial.setting, reference, _look_precision(trial, reference))
            elif self._fewer_workers_tie(trial, reference):
                self._climb_from(trial)
            else:
                self.lead = None
                self._next_neighbour()
        else:
            raise RuntimeError(f"the search is done ({self.kept}): it asks for no more measurements")
        return self.phase

    def _turn(self, phase: Phase, measured: Measured) -> None:
        neighbour = phase in (Phase.TRYING, Phase.CLOSE_CALL_NEIGHBOUR)
        if neighbour and self._again and self.turns:
            self.turns.pop()  # the blurred look it replaces
        self.turns.append((neighbour, measured.steps_per_sec))

    def _in_turns(self, trial: Measured, best: Measured) -> bool:
        """The two differ in intra-op threads alone: judged in looks taken in turn (:data:`TURNS_ROUNDS`)."""
        return best.setting.threads_alone(trial.setting)

    def _neighbour(self) -> Setting:
        """The neighbour on trial."""
        assert self._trial is not None
        return self._trial.setting

    def _faster(self, trial: Measured, than: Measured) -> bool:
        # a lead read from too few batches has an error that is itself a guess: it decides nothing
        if not (trial.trusted and than.trusted):
            return False
        if faster(trial.steps_per_sec, than.steps_per_sec, gap(trial.error, than.error, self.noise)):
            return True
        return faster_in_looks(trial.every_look, than.every_look)  # a small lead, steady over looks taken in turn

    def _ask(self, phase: Phase, setting: Setting, against: Measured | None, precision: float | None = None) -> None:
        self.phase, self.ask, self.precision = phase, (setting, against), precision

    def _climb_from(self, best: Measured) -> None:
        """``best`` is the incumbent: its neighbours are tried next."""
        self.best, self.lead = best, None
        first, self.first = self.first, ()
        self._neighbours = self.space.neighbours(best.setting, first)
        self._next_neighbour()

    def _next_neighbour(self) -> None:
        assert self.best is not None
        for candidate in self._neighbours:
            if candidate in self._tried:
                continue
            self._tried.add(candidate)
            self._trial, self._rounds, self.turns, self._relooked = None, 0, [], False
            self._ask(Phase.TRYING, candidate, self.best)
            return
        self.kept, self.phase = self.best, Phase.DONE

    def _blurred(self, trial: Measured, best: Measured) -> bool:
        """Behind the incumbent by less than twice their combined error, read by a look that ended (at its
        batch cap) at more than twice the noise floor: it says nothing yet. On the collate pipeline, 2 cores, one
        look in four read 11-28% error, and a neighbour 30% faster read 5% behind in one such look and was dropped."""
        behind = not ahead(trial.steps_per_sec, best.steps_per_sec, 0.0)
        tied = as_fast(trial.steps_per_sec, best.steps_per_sec, gap(trial.error, best.error, 0.0))
        return behind and self._noisy(trial) and tied

    def _noisy(self, look: Measured) -> bool:
        """A look that ended (at its batch cap) at more than twice the noise floor."""
        return math.isfinite(look.error) and look.error > 2 * self.noise

    def _look_again(self, look: Measured) -> bool:
        """The incumbent's look, taken to compare a neighbour (not in turns), ended noisy: it is dropped and taken
        again where it stands, once a neighbour. On the collate pipeline, 2 cores, the start's confirming look read
        188 ± 19% beside its first 222 ± 0.2%; pooled by batches they left 2 workers' 9.5% lead within the pair's
        error, and the run kept the start at 70% of the grid's best."""
        trial, best = self._trial, self.best
        if self._relooked or not self._noisy(look) or trial is None or best is None or self._in_turns(trial, best):
            return False
        self._relooked = True
        return True

    def _judge(self, trial: Measured) -> None:
        """A neighbour's measurement (its looks pooled) against the incumbent: the next phase."""
        best = self.best
        assert best is not None
        self._trial = trial
        won = self._faster(trial, best)
        if self._in_turns(trial, best) and (len(self.turns) > 1 or not won):
            self._judge_in_turns(trial, best)
            return
        # any lead, not only one past the noise floor: one look of the tokeniser's 4 workers read -2% to +7% of
        # 2 workers, 5-7% apart over 25-s runs
        unsure = not won and ahead(trial.steps_per_sec, best.steps_per_sec, 0.0)
        if unsure or won:
            self.lead = trial
        # a tie behind the start read by one look, which may have been its lucky one: on the collate pipeline the
        # start read 156 steps/s once (131 in the grid), 2 workers tied at 154 and were dropped, and the run kept
        # the start at 75% of the grid's best
        once = best.setting == self._start and len(best.every_look) == 1
        tied = once and as_fast(trial.steps_per_sec, best.steps_per_sec, self.noise)
        tie = not (won or unsure) and (tied or self._tied_fewer(trial, best))
        if self._blurred(trial, best) and self._rounds < CLOSE_CALL_ROUNDS:
            # measured again where it stands (no switch): the look, not the setting, was noisy
            self._again = True
            self._ask(Phase.CLOSE_CALL_NEIGHBOUR, trial.setting, best, _look_precision(trial, best))
        elif (unsure or tie) and self._rounds < CLOSE_CALL_ROUNDS:
            self._ask(Phase.CLOSE_CALL_INCUMBENT, best.setting, None, _look_precision(best, trial))
        elif not won and self._fewer_workers_tie(trial, best):
            self._climb_from(trial)
        elif not won:
            self.lead = None
            self._next_neighbour()
        elif trial.steps_per_sec > best.steps_per_sec * (1 + CONFIRM_BELOW):
            # no drift that big comes with one switch: kept without a second look
            self._climb_from(trial)
        else:
            self._ask(Phase.CONFIRMING, best.setting, None)

    def _judge_in_turns(self, trial: Measured, best: Measured) -> None:
        """A neighbour in threads alone, not plainly faster: it and the incumbent are looked at in turn until the
        looks decide either way (a lead, or none left above the noise floor; dropped at once where its first look is
        slower for sure, or its first pair of looks reads it slower beyond noise), or :data:`TURNS_ROUNDS` rounds."""
        if faster_in_turns(self.turns):
            self._climb_from(trial)
            return
        lead, _, pairs = lead_in_turns(self.turns)
        first = slower_for_sure(trial.steps_per_sec, trial.error, best.steps_per_sec, best.error) and pairs == 0
        behind = pairs == 1 and lead < -gap(trial.error, best.error, self.noise)
        settled = no_lead_in_turns(self.turns, self.noise) or self._rounds >= TURNS_ROUNDS
        if not (first or behind) and settled and self._fewer_threads_tie(trial, best):
            self._climb_from(trial)
            return
        if first or behind or settled:
            self.lead = None
            self._next_neighbour()
            return
        self.lead = trial if lead > 0 or not pairs else None
        if self.turns[-1][0]:
            self._ask(Phase.CLOSE_CALL_INCUMBENT, best.setting, None)
        else:
            self._ask(Phase.CLOSE_CALL_NEIGHBOUR, trial.setting, best)

    def _fewer_threads_tie(self, trial: Measured, best: Measured) -> bool:
        """A neighbour with fewer intra-op threads, as fast in turns (:func:`as_fast_in_turns`): kept, and said in
        :attr:`ties`. A tie of thread counts goes to fewer: as fast alone, they hold up beside other work on the
        cores (``threads_beside_load.py``: 1 thread 1.47x, 2 threads 0.20x beside one busy process), and on the
        dicts pipeline 2 threads dipped 10-15% for looks at a time where 1 did not (kept either in 6 of 10 runs)."""
        fewer, more = trial.setting.threads, best.setting.threads
        if fewer >= more or not as_fast_in_turns(self.turns, self.noise):
            return False
        lead, error, looks = lead_in_turns(self.turns)
        self.ties.append(
            f"{counted(fewer, 'thread')} kept over {counted(more, 'thread')} on a tie ({lead:+.1%} ± {error:.1%} in"
            f" {looks} looks, in turn): as fast, and fewer threads hold up beside other work on the cores"
        )
        return True

    def _fewer_workers(self, trial: Measured, best: Measured) -> bool:
        """``trial`` differs from the incumbent only in fewer workers (one at least), and no worker tie was kept
        yet in this search: ties do not chain, so the kept setting is within one tie of the fastest read."""
        fewer, more = trial.setting, best.setting
        return more.workers_alone(fewer) and 0 < fewer.num_workers < more.num_workers and not self._worker_tie

    def _tied_fewer(self, trial: Measured, best: Measured) -> bool:
        """Fewer workers (:meth:`_fewer_workers`) behind by less than the noise floor: worth a close call, as a lead
        would be, for a tie goes to fewer workers."""
        return self._fewer_workers(trial, best) and as_fast(trial.steps_per_sec, best.steps_per_sec, self.noise)

    def _fewer_workers_tie(self, trial: Measured, best: Measured) -> bool:
        """A neighbour with fewer workers, its close call over undecided (or its lead gone when the incumbent was
        measured again) and its looks pooled within :data:`WORKERS_TIE` of the incumbent's: kept, and said in
        :attr:`ties`. On the collate pipeline, 2 cores, 3 and 4 workers read 0-5% apart by the day, each ahead on
        some, and the one reached first stayed (3 workers in 8-9 of 10 runs); with the tie, 10 of 10. Fewer workers
        leave the cores to the step and to other work, and hold less memory."""
        if not (self._fewer_workers(trial, best) and self._rounds >= CLOSE_CALL_ROUNDS):
            return False
        lead = trial.steps_per_sec / best.steps_per_sec - 1
        if lead < -WORKERS_TIE * self.noise:
            return False
        self._worker_tie = True
        error = math.hypot(trial.error, best.error)
        fewer, more = trial.setting.num_workers, best.setting.num_workers
        self.ties.append(
            f"{counted(fewer, 'worker')} kept over {more} on a tie ({lead:+.1%} ± {error:.1%},"
            f" {len(trial.every_look)} looks each): as fast, and fewer workers leave the cores to the step and hold"
            " less memory"
        )
        return True


def _look_precision(pooled: Measured, other: Measured) -> float | None:
    """The error one more look at ``pooled``'s setting must reach for its looks, pooled, to decide the lead between
    it and ``other`` (:data:`CLOSE_CALL_MARGIN` smaller than read) beside ``other`` as precise; ``None``: the
    loop's own precision (an error unknown, or already enough). The loop asks no finer than
    :data:`CLOSE_CALL_FINEST` of its own."""
    lead = abs(pooled.steps_per_sec / other.steps_per_sec - 1) if other.steps_per_sec else 0.0
    if not (lead and pooled.batches and math.isfinite(pooled.error)):
        return None
    # two settings at error e each differ beyond noise once the lead exceeds 2 * sqrt(2) * e
    target = lead / (2 * math.sqrt(2) * CLOSE_CALL_MARGIN)
    # a look's error falls as one over the root of its batches: the batches still needed, at the per-batch spread
    spread = pooled.error * math.sqrt(pooled.batches)
    more = (spread / target) ** 2 - pooled.batches
    return spread / math.sqrt(more) if more > 0 else None
