"""The online loop's records: a setting, its measurement, the settings around it, and what the loop kept."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

__all__ = ["MIN_TRUSTED_BATCHES", "Measured", "OnlineResult", "Setting", "SettingSpace", "counted"]

#: Fewer batches than this cannot be trusted to measure their own error: the standard error estimated from ``n``
#: periods is itself off by about ``1 / sqrt(2 (n - 1))``, 25% at 9 and 50% at 3 (the quickstart's 3-4-batch
#: trials read 19-43% error and printed gains of 1.50-2.03x for a run that gained 1.56-1.73x).
MIN_TRUSTED_BATCHES = 9

#: A gain whose relative error exceeds this is printed as a lead, never as a measured gain.
MEASURED_ERROR = 0.10


def counted(count: int, noun: str) -> str:
    """``2 workers``, ``1 thread``: the count and its noun, plural but for one."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


@dataclass(frozen=True)
class Setting:
    """One point the loop can try: the loader's settings and the training process's intra-op threads.

    ``gpu_share``: ``None`` for a loader that does not split its decode; else the share of each batch's images
    decoded on the GPU (0: CPU only, 1: GPU only). ``persistent_workers``: workers kept alive across epochs.
    """

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    threads: int
    gpu_share: float | None = None
    persistent_workers: bool = False

    def describe(self) -> str:
        prefetch = f", prefetch_factor={self.prefetch_factor}" if self.num_workers else ""
        words = f"num_workers={self.num_workers}{prefetch}, pin_memory={self.pin_memory}, threads={self.threads}"
        if self.persistent_workers and self.num_workers:
            words += ", persistent_workers=True"
        if self.gpu_share is not None:
            words += f", gpu_share={self.gpu_share:g}"
        return words

    def threads_alone(self, other: Setting) -> bool:
        """``other`` differs from this setting in intra-op threads alone (or not at all): a switch that restarts
        nothing, the training process's threads set."""
        return replace(other, threads=self.threads) == self

    def workers_alone(self, other: Setting) -> bool:
        """``other`` differs from this setting in its worker count alone (and the prefetch that goes with it), or not
        at all."""
        return replace(other, num_workers=self.num_workers, prefetch_factor=self.prefetch_factor) == self

    def short(self) -> str:
        """The setting in a few words: ``2 workers + 1 thread``."""
        words = f"{counted(self.num_workers, 'worker')} + {counted(self.threads, 'thread')}"
        if self.gpu_share is not None:
            words += f", GPU share {self.gpu_share:g}"
        if self.persistent_workers and self.num_workers:
            words += ", persistent"
        return words


@dataclass(frozen=True)
class Measured:
    """A setting's steady step rate on the real training steps, and what trying it cost."""

    setting: Setting
    steps_per_sec: float
    error: float
    """Relative standard error of ``steps_per_sec`` (``inf`` when it was cut before two rounds)."""
    batches: int
    seconds: float
    switch_s: float = 0.0
    """Seconds the switch to this setting stalled training (old workers stopped, new ones started)."""
    cost_s: float = 0.0
    """What trying it cost: its seconds beyond the setting it stood in for would have taken, and the switch's stall."""
    looks: tuple[tuple[float, float], ...] = ()
    """Each look pooled into it, ``(rate, relative error)``, in the order taken (empty: this one look alone)."""

    @property
    def every_look(self) -> tuple[tuple[float, float], ...]:
        """Its looks, ``(rate, relative error)`` each; a single look's own figures where none were pooled."""
        return self.looks or ((self.steps_per_sec, self.error),)

    @property
    def trusted(self) -> bool:
        """Enough batches (:data:`MIN_TRUSTED_BATCHES`) for its error to be trusted, and a finite error."""
        return self.batches >= MIN_TRUSTED_BATCHES and math.isfinite(self.error)

    def pooled(self, again: Measured) -> Measured:
        """The two measurements of one setting as one (batch-weighted rate and error)."""
        batches, seconds = self.batches + again.batches, self.seconds + again.seconds
        # weighted as the rate is: a long look counts for more than a short one
        terms = [count * error for count, error in ((self.batches, self.error), (again.batches, again.error)) if count]
        error = math.hypot(*terms) / batches if batches else math.inf
        cost = self.cost_s + again.cost_s
        looks = self.every_look + again.every_look
        return replace(
            self, steps_per_sec=batches / seconds, error=error, batches=batches, seconds=seconds, cost_s=cost,
            looks=looks,
        )  # fmt: skip

    def words(self) -> str:
        """``2 workers + 1 thread: 31.2 steps/s ± 2% (140 batches, 4.5 s)``."""
        error = f"± {self.error:.0%}" if math.isfinite(self.error) else "error unknown"
        return (
            f"{self.setting.short()}: {self.steps_per_sec:.1f} steps/s {error}"
            f" ({self.batches} batches, {self.seconds:.2f} s)"
        )


@dataclass(frozen=True)
class SettingSpace:
    """The settings the loop may try around a starting point (bounded by the machine).

    ``min_workers``: never fewer workers than this (1 where the user's ``worker_init_fn`` must run). ``tune_share``:
    a split-decode loader's GPU share is tried (the ends 0 and 1, and halving steps). ``tune_persistent``: workers
    kept across epochs are tried (set it only for a run of several epochs).
    """

    max_workers: int
    cpus: int
    tune_threads: bool
    """CPU runs: the training process's intra-op threads compete with the workers for the cores."""
    tune_pinning: bool
    """CUDA runs without the side stream: pinned and pageable host memory are both tried."""
    min_workers: int = 0
    tune_share: bool = False
    tune_persistent: bool = False
    decode_workers: int = 0
    """A split-decode loader: the workers that decode every image on the CPU (the policy's count for the rank); a
    move of the share toward the CPU carries at least its part of them (the GPU end's workers only read files)."""

    def neighbours(self, at: Setting, first: Sequence[Setting] = ()) -> Iterator[Setting]:
        """``first`` (the moves the start's measured facts point to), then a split-decode loader's GPU share (where
        to decode moves the rate most), then worker counts up (the larger move first) and down (on a CPU run each also
        with the cores they leave as intra-op threads), then threads, prefetch, pinning and persistence at ``at``'s
        workers; never below ``min_workers``."""
        for setting in first:
            if self.min_workers <= setting.num_workers <= self.max_workers:
                yield setting
        if self.tune_share and at.gpu_share is not None:
            # on the H200 the two ends fed a compiled ResNet-50 at 99% and 78% of its ceiling: more than any worker move
            yield from (self._with_share(at, share) for share in share_steps(at.gpu_share))
        workers = at.num_workers
        ups = [2 * workers, workers * 3 // 2, workers + 1] if workers else [2, 1]
        # one at a time, a climb from 4 workers to the H200's 24 took 11 trials and did not end in 120 s
        counts = list(dict.fromkeys(count for count in ups if workers < count <= self.max_workers))
        if workers > 3:  # after a doubling overshot: halfway back, then the half
            counts += list(dict.fromkeys([workers * 3 // 4, workers // 2]))
        elif workers:
            counts.append(workers - 1)
        for count in counts:
            if count < self.min_workers:
                continue
            moved = self._with_workers(at, count)
            yield moved
            # workers and intra-op threads share the cores: a move of one alone can hide the pair that wins
            if self.tune_threads and (left := max(1, self.cpus - count)) != at.threads:
                yield replace(moved, threads=left)
        yield from self.thread_moves(at)
        if workers and at.prefetch_factor is not None and at.prefetch_factor < 8:
            yield replace(at, prefetch_factor=at.prefetch_factor * 2)
        if self.tune_pinning:
            yield replace(at, pin_memory=not at.pin_memory)
        if self.tune_persistent and workers and not at.persistent_workers:
            yield replace(at, persistent_workers=True)

    def thread_moves(self, at: Setting) -> Iterator[Setting]:
        """``at`` with each other intra-op thread count worth a trial: 1, the cores its workers leave, all cores (a
        CPU run only)."""
        if self.tune_threads:
            for threads in sorted({1, max(1, self.cpus - at.num_workers), self.cpus} - {at.threads}):
                yield replace(at, threads=threads)

    def _with_share(self, at: Setting, share: float) -> Setting:
        """``at`` at GPU share ``share``; toward the CPU with workers for its part of the decode: on an H100 the CPU
        end read 14 steps/s at the GPU end's 4 workers, 23 at 8, and fed a compiled ResNet-50 at 99% at 15."""
        moved = replace(at, gpu_share=share)
        if share >= (at.gpu_share or 0.0) or self.decode_workers <= at.num_workers:
            return moved
        needed = at.num_workers + math.ceil((self.decode_workers - at.num_workers) * (1.0 - share))
        return self._with_workers(moved, min(self.max_workers, needed))

    def moved(self, at: Setting, workers: int) -> Setting:
        """``at`` with ``workers`` workers (its prefetch and persistence kept where they apply)."""
        return self._with_workers(at, workers)

    @staticmethod
    def _with_workers(at: Setting, workers: int) -> Setting:
        prefetch = (at.prefetch_factor or 2) if workers else None
        # the preference stays at 0 workers: a later count of workers keeps them across epochs again
        return replace(at, num_workers=workers, prefetch_factor=prefetch)


def share_steps(share: float) -> list[float]:
    """A GPU share's neighbours: the two ends first (each a path of its own), then half the way to each end."""
    ends = [end for end in (0.0, 1.0) if end != share]
    halves = [round(share / 2, 4), round((share + 1) / 2, 4)]
    return list(dict.fromkeys(s for s in ends + halves if s != share and 0.0 <= s <= 1.0))


@dataclass
class OnlineResult:
    """What the loop measured, what it kept, and what the trying cost.

    ``unconfirmed``: a setting that read ahead of the kept one but not beyond its error (or from too few batches)
    when the cost cap or the run's end ended the search; ``cap_s`` and ``cap_left_s``: the cap in seconds and what
    it allowed then; ``unconfirmed_because``: why, where not the cap; ``notes``: what the loop said beside its
    trials (a run too short to decide, up front; a tie of thread counts settled for fewer threads).
    """

    start: Measured | None = None
    kept: Measured | None = None
    trials: list[Measured] = field(default_factory=list)
    done: bool = False
    stop_reason: str = ""
    looks: int = 0
    """Searches started again after the kept setting's step rate drifted."""
    unconfirmed: Measured | None = None
    cap_s: float | None = None
    cap_left_s: float | None = None
    max_cost: float | None = None
    notes: list[str] = field(default_factory=list)
    unconfirmed_because: str = ""

    @property
    def gain(self) -> float | None:
        """The kept setting's rate over the starting one's (measured on this run; ``None`` where the step rate
        drifted after the start was measured and the search ran again: two rates of different moments)."""
        if self.start is None or self.kept is None or self._drifted():
            return None
        return self.kept.steps_per_sec / self.start.steps_per_sec

    @property
    def gain_error(self) -> float:
        """The relative error of :attr:`gain` (``inf`` when unknown)."""
        if self.start is None or self.kept is None or self._drifted():
            return math.inf
        if self.kept.setting == self.start.setting:
            return 0.0
        return math.hypot(self.kept.error, self.start.error)

    @property
    def share_ends(self) -> dict[float, Measured]:
        """For a split-decode loader: each end of the GPU share (0, 1) the loop measured, its fastest trial (the
        summary and the verdict read the same)."""
        ends = {}
        for share in (0.0, 1.0):
            at = [trial for trial in self.trials if trial.setting.gpu_share == share and trial.steps_per_sec > 0]
            # a trial cut before two rounds (error inf) stands for its end only where none was measured in full
            at = [trial for trial in at if math.isfinite(trial.error)] or at
            if at:
                ends[share] = max(at, key=lambda trial: trial.steps_per_sec)
        return ends

    @property
    def cost_s(self) -> float:
        """Seconds the search cost the run: each trial's steps slower than the setting in use, and the switches."""
        return sum(trial.cost_s for trial in self.trials)

    def summary(self) -> str:
        notes = "".join(f"; {note}" for note in self.notes)
        if self.start is None:
            return f"online tuning: {self.stop_reason or 'nothing measured yet'}{notes}"
        if self.kept is None:
            return f"online tuning: still searching, {len(self.trials)} trials measured on this run's steps so far"
        seconds = sum(trial.seconds + trial.switch_s for trial in self.trials)
        return (
            f"online tuning kept {self.kept.setting.describe()}: {self.kept.steps_per_sec:.1f} steps/s,"
            f" {self._gain_words()} ({len(self.trials)} trials in {seconds:.1f} s, measured on this run's steps;"
            f" cost {self.cost_s:.1f} s; {self.stop_reason}"
            + (f"; looked again {self.looks} times after the step rate drifted" if self.looks else "")
            + ")"
            + self._unconfirmed_words()
            + self._share_words()
            + notes
            + "; trials: "
            + "; ".join(trial.words() for trial in self.trials)
        )

    def _drifted(self) -> bool:
        kept, start = self.kept, self.start
        return bool(self.looks) and kept is not None and start is not None and kept.setting != start.setting

    def _gain_words(self) -> str:
        gain, error = self.gain, self.gain_error
        assert self.start is not None
        start = f"the start's {self.start.steps_per_sec:.1f} steps/s"
        if self.kept is not None and self.kept.setting == self.start.setting:
            return f"the start kept (1.00x {start})"
        if gain is None:
            # a dicts run printed 0.96x for the setting it kept: its last look beside the start's first, moments apart
            return f"no gain given: the step rate drifted after {start} were measured"
        if error > MEASURED_ERROR:
            # a lead from a noisy pair is no measured gain: said with its error, never as the run's gain
            return f"{gain:.2f}x ± {error:.0%} {start} (not measured to {MEASURED_ERROR:.0%}: a lead, not a gain)"
        return f"{gain:.2f}x ± {error:.0%} {start}"

    def _unconfirmed_words(self) -> str:
        lead, kept = self.unconfirmed, self.kept
        if lead is None or kept is None or not kept.steps_per_sec:
            return ""
        change = lead.steps_per_sec / kept.steps_per_sec - 1
        error = math.hypot(lead.error, kept.error)
        error_words = f"± {error:.0%}" if math.isfinite(error) else "(error unknown)"
        read = f"; {lead.setting.short()} read {change:+.0%} {error_words} in {lead.batches} batches; not confirmed:"
        if self.unconfirmed_because:
            return f"{read} {self.unconfirmed_because}"
        cap = f"the {self.max_cost:.0%} cap" if self.max_cost is not None else "the cost cap"
        cap += f" ({self.cap_s:.2f} s)" if self.cap_s is not None else ""
        left = self.cap_left_s or 0.0
        left_words = f" allows {left:.2f} s more" if left >= 0.005 else " was spent"
        return (
            f"{read} {cap}{left_words}; a longer run, or OnlineTuning(max_cost=...) above {self.max_cost or 0.05:g},"
            " would settle it"
        )

    def _share_words(self) -> str:
        ends = self.share_ends
        if len(ends) < 2:
            return ""
        cpu, gpu = ends[0.0], ends[1.0]
        return f"; decode on the CPU only {cpu.steps_per_sec:.1f} steps/s, on the GPU only {gpu.steps_per_sec:.1f}"
