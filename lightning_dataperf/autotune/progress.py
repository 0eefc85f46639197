"""Autotune's progress while it searches: a tqdm bar, log lines, or nothing (a silent search looks like a hang)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["SearchProgress", "make_progress"]


def _config_text(config: tuple[int, int | None, bool]) -> str:
    workers, prefetch, pin = config
    return f"workers={workers} prefetch={prefetch if workers else '-'} pin={'yes' if pin else 'no'}"


def _trial_text(trial: Any) -> str:
    sharing = getattr(trial, "sharing", None)
    return _config_text(trial.config) + (f" sharing={sharing}" if sharing else "")


def _rate_text(trial: Any) -> str:
    """``"438.4 batches/s"``; a rough trial's rate (the start-up burst) says it is not ranked."""
    rough = " rough (cut before one steady round: not ranked)" if getattr(trial, "rough", False) else ""
    return f"{trial.batches_per_sec:.1f} batches/s{rough}"


class SearchProgress:
    """Silent base: counts trials and keeps an estimate of how many the search will take."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.index = 0
        self.estimate = 8
        self.config: tuple[int, int | None, bool] | None = None

    def __call__(self, event: str, value: Any) -> None:
        if event == "start":
            self.index += 1
            self.estimate = max(self.estimate, self.index + 1)
            self.config = value
            self.started(value)
        elif event == "progress":
            self.running(value)
        elif event == "done":
            self.finished(value)
        elif event == "nothing":
            trial, why = value if isinstance(value, tuple) else (value, None)
            self.measured_nothing(trial, why)
        elif event == "estimate":
            self.estimate = max(self.index + 1, int(value))

    def started(self, config: tuple[int, int | None, bool]) -> None:
        pass

    def running(self, rate: float) -> None:
        pass

    def finished(self, trial: Any) -> None:
        pass

    def measured_nothing(self, trial: Any, why: tuple[str, str] | None = None) -> None:
        """A repeat of ``trial`` that measured nothing, cut by ``why`` (the limit, more about it; by default: as
        :meth:`finished`, the trial unchanged)."""
        self.finished(trial)

    def close(self, result: Any = None) -> None:
        pass


class LogProgress(SearchProgress):
    """One line per finished trial, and one at the end."""

    def finished(self, trial: Any) -> None:
        again = f", measured {trial.measurements}x" if trial.measurements > 1 else ""
        self.stream.write(
            f"DataPerf autotune: trial {self.index}/~{self.estimate} {_trial_text(trial)}: "
            f"{_rate_text(trial)} (start-up {trial.startup_s:.2f} s, trial {trial.seconds:.1f} s"
            f"{again})\n"
        )
        self.stream.flush()

    def measured_nothing(self, trial: Any, why: tuple[str, str] | None = None) -> None:
        limit, more = why or ("the time budget ran out", "")
        more = f"; {more}" if more else ""
        self.stream.write(
            f"DataPerf autotune: trial {self.index}/~{self.estimate} {_trial_text(trial)}: measured nothing more "
            f"({limit} before one steady round{more}); kept at {_rate_text(trial)}\n"
        )
        self.stream.flush()

    def close(self, result: Any = None) -> None:
        if result is not None:
            self.stream.write(f"DataPerf autotune: done in {result.search_seconds:.1f} s: {result.summary_line()}\n")
            self.stream.flush()


class BarProgress(SearchProgress):
    """A tqdm bar: trial k of ~n, the setting and the rate so far."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.estimate, desc="DataPerf autotune", unit="trial", file=self.stream, leave=False)

    def started(self, config: tuple[int, int | None, bool]) -> None:
        self.bar.total = self.estimate
        self.bar.set_postfix_str(_config_text(config), refresh=True)

    def running(self, rate: float) -> None:
        if self.config is not None:
            self.bar.set_postfix_str(f"{_config_text(self.config)}: {rate:.1f} batches/s so far", refresh=True)

    def finished(self, trial: Any) -> None:
        self.bar.set_postfix_str(f"{_trial_text(trial)}: {_rate_text(trial)}", refresh=False)
        self.bar.update(1)

    def measured_nothing(self, trial: Any, why: tuple[str, str] | None = None) -> None:
        cut = f" ({why[0]})" if why else ""
        self.bar.set_postfix_str(f"{_trial_text(trial)}: measured nothing more{cut}", refresh=False)
        self.bar.update(1)

    def close(self, result: Any = None) -> None:
        self.bar.total = self.bar.n
        self.bar.close()
        if result is not None:
            self.stream.write(f"DataPerf autotune: done in {result.search_seconds:.1f} s: {result.summary_line()}\n")
            self.stream.flush()


def make_progress(spec: Any, stream: TextIO | None = None) -> SearchProgress:
    """``"bar"``, ``"log"``/``True``, ``"auto"``, ``False``/``None``/``"off"``, or a :class:`SearchProgress`.

    The listener is called with ``("start", config)``, ``("progress", batches_per_sec_so_far)``, ``("done", trial)``
    (or ``("nothing", (trial, why))``: a repeat of ``trial`` that measured nothing, ``why`` the limit that cut it
    before one steady round: the time budget or the dataset) and, at the end, :meth:`SearchProgress.close`:

    * ``"bar"``: a tqdm bar on stderr (what the Trainer's ``TQDMProgressBar`` uses): trial k of ~n, the
      setting, the rate so far;
    * ``"log"`` (or ``True``): one line per finished trial on stderr, ``DataPerf autotune: trial 3/~9 ...``;
    * ``"auto"``: a bar when stderr is a terminal, log lines otherwise;
    * ``False`` / ``None`` / ``"off"``: silent.

    Example::

        progress = make_progress("log")
        progress("start", (8, 2, True)); progress("done", trial); progress.close(result)
    """
    if isinstance(spec, SearchProgress):
        return spec
    if spec in (False, None, "off", "none"):
        return SearchProgress(stream)
    if spec == "auto":
        target = stream if stream is not None else sys.stderr
        spec = "bar" if getattr(target, "isatty", lambda: False)() else "log"
    if spec == "bar":
        try:
            return BarProgress(stream)
        except ImportError:
            return LogProgress(stream)
    if spec in (True, "log"):
        return LogProgress(stream)
    raise ValueError(f"autotune progress={spec!r}: use 'bar', 'log', 'auto', True or False.")
