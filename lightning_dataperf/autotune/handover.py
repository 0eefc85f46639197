"""Autotune's hand-over trial: the workers sending their batches by shared-memory file name, where that can help.

When it is made and kept is section 8 of docs/autotune.md.
"""

from __future__ import annotations

import math

from lightning_dataperf.autotune.compare import Compare
from lightning_dataperf.autotune.model import IDLE_WORKERS, SATURATED_WORKERS, loader_headroom
from lightning_dataperf.autotune.trial import Trial, percent_change
from lightning_dataperf.loader.sharing import FAST_HANDOVER, process_strategy

__all__ = ["NO_TRIAL_AFTER", "Handover", "gain_beyond_reach"]

#: Climb stops after which no hand-over trial is made: the training path, settings that are yours, refusals.
NO_TRIAL_AFTER = frozenset({"path", "fixed", "memory guard", "dataset", ""})


def gain_beyond_reach(best: Trial, noise: float) -> str:
    """Why no loader change could be shown faster than ``best``, or ``""``.

    The most one can gain (:func:`~lightning_dataperf.autotune.model.loader_headroom`: the main thread's
    wait) is within the least gap :meth:`~lightning_dataperf.autotune.compare.Compare.faster` would ask of a
    new trial against ``best`` (``best``'s own error, and half the noise for the new one).
    """
    headroom = loader_headroom(best)
    least = max(noise, 2 * math.hypot(best.relative_error(noise / 2), noise / 2))
    if headroom is None or headroom > least:
        return ""
    waited = 100 * (best.wait_share or 0.0)
    return f"the main thread waited {waited:.0f}% of the time: at most {100 * headroom:+.0f}%, within noise"


class Handover:
    """One search's hand-over trial: the seconds the climb keeps back for it (:attr:`reserve`), whether it was
    made, and what it measured (:attr:`detail`).

    Example::

        handover = Handover()
        faster = handover.attempt(compare, best)      # None: not tried, or not faster beyond noise
        handover.detail                              # "file_system sharing measured +27% (335.8 against ...)"
    """

    def __init__(self, reserve: float = 0.0) -> None:
        self.reserve = reserve
        self.tried = False
        self.detail = ""

    def said_of(self, chosen: Trial, adopted: str | None) -> str:
        """:attr:`detail`, and where the search adopted the hand-over (``adopted``) but chose a trial measured
        the default way (the policy's pick is the floor: only a faster one beyond noise replaces it), that it
        was not kept."""
        if adopted is None or chosen.sharing == adopted or not self.detail:
            return self.detail
        if not chosen.num_workers:  # nothing is sent: the main thread loads
            return f"{self.detail}; not kept: loading in the main thread (0 workers) was as fast"
        return f"{self.detail}; not kept: {chosen.num_workers} workers sending the default way were as fast"

    def attempt(self, compare: Compare, best: Trial, stopped: bool = True) -> Trial | None:
        """The ``file_system`` trial at ``best``'s settings, once per search; the faster trial, adopted, or ``None``.

        ``stopped``: where the climb stopped (not after :data:`NO_TRIAL_AFTER`); ``False``: mid-climb, where
        :func:`~lightning_dataperf.autotune.model.handover_bound` says the hand-over binds (mostly idle
        workers made much more than arrived). Not tried without workers, where the process already sends
        that way, where no gain could be shown (:func:`gain_beyond_reach`), or where the workers were busy
        :data:`~lightning_dataperf.autotune.model.SATURATED_WORKERS` of their time (said in :attr:`detail`).
        Faster, but not beyond the noise of one trial each, it is measured once more with the same workers and
        kept if still faster beyond the noise, as the climb does. Where the workers were mostly idle (busy under
        :data:`~lightning_dataperf.autotune.model.IDLE_WORKERS`: they do not limit, the hand-over may), a trial
        within noise *below* is measured again too, and so is ``best``.
        Mid-climb, the climb still keeps :attr:`reserve` back for this trial: it is given back as the trial is made.
        """
        runner = compare.runner
        wanted = not stopped or compare.stop_reason not in NO_TRIAL_AFTER
        if not wanted or self.tried or runner.sharing is not None or not best.num_workers:
            return None  # not where it could help, or tried already
        if best.refused is not None or process_strategy() == FAST_HANDOVER:
            return None
        if beyond := gain_beyond_reach(best, compare.limits.noise):
            self.detail = f"{FAST_HANDOVER} sharing not measured ({beyond})"
            return None
        if best.worker_busy is not None and best.worker_busy >= SATURATED_WORKERS:
            busy = f"the workers were busy {100 * best.worker_busy:.0f}% of their time: they made what arrived"
            self.detail = f"{FAST_HANDOVER} sharing not measured ({busy})"
            return None
        # what the climb keeps for this trial is spent on it; what it leaves, the climb's
        if not stopped:
            runner.release(self.reserve)
        if runner.remaining <= 0:
            self.detail = f"{FAST_HANDOVER} sharing not measured (the time budget ran out)"
            return None
        self.tried = True
        trial = runner.measure_sharing(best, FAST_HANDOVER)
        if not trial.judged:  # refused, or cut before one steady round: it proves nothing
            rough = f": {trial.batches_per_sec:.1f} batches/s, rough" if trial.refused is None else ""
            self.detail = (
                f"{FAST_HANDOVER} sharing not judged (the time budget ran out before its trial's first steady "
                f"round{rough})"
            )
            return None
        # mostly idle workers do not limit, the hand-over may: a reading within noise either side is raced too
        idle = best.worker_busy is not None and best.worker_busy < IDLE_WORKERS
        before = runner.latest(best)
        trial, faster = compare.confirmed(trial, before, race=idle)
        reference = runner.latest(best)  # measured again too where the repeat stayed ahead within noise
        change = percent_change(trial, reference)
        words = (
            f"{trial.batches_per_sec:.1f} against {reference.batches_per_sec:.1f} batches/s at {best.num_workers} "
            "workers"
        )
        if faster:
            twice = ", measured twice" if trial.measurements > 1 else ""
            twice += " each" if reference is not before else ""
            self.detail = f"{FAST_HANDOVER} sharing measured {change} ({words}{twice})"
            runner.adopt(trial)
            return trial
        unsure = trial.batches_per_sec > reference.batches_per_sec  # faster, but a short trial's noise is wider
        self.detail = (
            f"{FAST_HANDOVER} sharing {'not faster beyond noise' if unsure else 'gave nothing'} ({change}: {words})"
        )
        return None
