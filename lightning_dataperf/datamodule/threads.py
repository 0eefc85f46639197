"""CPU training: the training process's intra-op threads set beside the loader's workers, and given back."""

from __future__ import annotations

import torch

from lightning_dataperf.loader.policy import intra_op_threads
from lightning_dataperf.loader.settings import LoaderPlan

__all__ = ["ThreadsBeside", "set_threads"]


def set_threads(count: int) -> None:
    """``torch.set_num_threads(count)`` only where the count changes: every switch of the online loop would make
    one, and a call with the same count changes nothing."""
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


class ThreadsBeside:
    """``TunedDataModule(intra_op_threads=...)``: ``"auto"`` (the policy's, where the workers and threads would
    outnumber the cores), a count, or ``None`` (left alone); the user's count is restored after ``fit``, also
    where the online loop changed it, and also when ``fit`` fails or is interrupted (``TunedDataModule.on_exception``).

    Example::

        threads = ThreadsBeside("auto")
        threads.apply(workers=1, cpus=2, plan=plan)   # torch.set_num_threads(1), noted in the plan
        threads.restore()                             # the count from before, at teardown or on an exception
    """

    def __init__(self, choice: int | str | None) -> None:
        if choice not in ("auto", None) and not (isinstance(choice, int) and choice > 0):
            raise ValueError(f"intra_op_threads={choice!r}: use 'auto', None or a positive int")
        self.choice = choice
        self.user: int | None = None  # the count before this fit, where this fit may change it
        self._changed = False

    def apply(self, workers: int, cpus: int, plan: LoaderPlan, loop: bool = False) -> None:
        """Set the threads beside ``workers`` on ``cpus`` cores, once a fit; ``loop``: the online loop may change
        them later (the count from before is given back then too)."""
        current = torch.get_num_threads()
        if loop and self.user is None:
            self.user = current
        if self.choice is None or self._changed:
            return
        if self.choice == "auto":
            chosen = intra_op_threads(workers, cpus, current)
        else:
            chosen = (int(self.choice), "yours") if int(self.choice) != current else None
        if chosen is None:
            return
        (threads, reason), self._changed = chosen, True
        self.user = current if self.user is None else self.user
        set_threads(threads)
        plan.chosen["intra_op_threads"] = threads
        plan.notes.append(
            f"torch.set_num_threads({threads}) (was {current}) <- {reason}; restored after fit"
            + ("; intra_op_threads=None keeps yours" if self.choice == "auto" else "")
        )

    def restore(self) -> None:
        """The count from before the fit back (after the online loop's own change, where it ran); once."""
        if self.user is not None:
            set_threads(self.user)
        self.user, self._changed = None, False
