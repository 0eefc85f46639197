"""CPU training: the training process's intra-op threads set beside the loader's workers, and given back."""

from __future__ import annotations

import torch

from lightning_dataperf.loader.policy import intra_op_threads
from lightning_dataperf.loader.settings import LoaderPlan

__all__ = ["ThreadsBeside"]


class ThreadsBeside:
    """``TunedDataModule(intra_op_threads=...)``: ``"auto"`` (the policy's, where the workers and threads would
    outnumber the cores), a count, or ``None`` (left alone); the user's count is restored after ``fit``.

    Example::

        threads = ThreadsBeside("auto")
        threads.apply(workers=1, cpus=2, plan=plan)   # torch.set_num_threads(1), noted in the plan
        threads.restore()                             # the count from before, at teardown
    """

    def __init__(self, choice: int | str | None) -> None:
        if choice not in ("auto", None) and not (isinstance(choice, int) and choice > 0):
            raise ValueError(f"intra_op_threads={choice!r}: use 'auto', None or a positive int")
        self.choice = choice
        self.user: int | None = None

    def apply(self, workers: int, cpus: int, plan: LoaderPlan) -> None:
        if self.choice is None or self.user is not None:
            return
        current = torch.get_num_threads()
        if self.choice == "auto":
            chosen = intra_op_threads(workers, cpus, current)
        else:
            chosen = (int(self.choice), "yours") if int(self.choice) != current else None
        if chosen is None:
            return
        (threads, reason), self.user = chosen, current
        torch.set_num_threads(threads)
        plan.chosen["intra_op_threads"] = threads
        plan.notes.append(
            f"torch.set_num_threads({threads}) (was {current}) <- {reason}; restored after fit"
            + ("; intra_op_threads=None keeps yours" if self.choice == "auto" else "")
        )

    def restore(self) -> None:
        if self.user is not None:
            torch.set_num_threads(self.user)
            self.user = None
