"""Several DataPerfCallbacks in one Trainer: one per stage, each with its own checkpoint state."""

from __future__ import annotations

from collections.abc import Sequence

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dataperf.tags import Stage

__all__ = ["OnePerStage", "stages_state_key"]


def stages_state_key(name: str, stages: Sequence[Stage]) -> str:
    """The checkpoint key of a callback class ``name`` timing ``stages``: the name alone for every stage (as
    before ``stages=`` could differ, so older checkpoints restore), else the name and the stages.

    Example::

        stages_state_key("DataPerfCallback", (Stage.TRAIN,))   # "DataPerfCallback{'stages': ('train',)}"
    """
    if set(stages) == set(Stage):
        return name
    return f"{name}{{'stages': {tuple(stage.value for stage in stages)!r}}}"


class OnePerStage(Callback):
    """A callback with ``stages``, keyed in checkpoints by them: several in one Trainer, one per stage.

    Example::

        Trainer(callbacks=[DataPerfCallback(stages="train"), DataPerfCallback(stages="val")])   # each its own state
    """

    stages: tuple[Stage, ...] = tuple(Stage)
    _checked = False  # check_stages_apart found no other callback of these stages

    @property
    @override
    def state_key(self) -> str:
        """The checkpoint's key for this callback's state: :func:`stages_state_key` of its class and stages."""
        key = stages_state_key(type(self).__qualname__, self.stages)
        # Lightning refuses equal keys when the Trainer is built, in words that do not say what to change: until
        # setup has run check_stages_apart, each instance's key is its own
        return key if self._checked else f"{key}@{id(self):x}"

    def check_stages_apart(self, trainer: pl.Trainer) -> None:
        """Refuse a second callback of this class in ``trainer`` that times one of these stages (or, like this
        one, none); from here on, :attr:`state_key` is the one checkpoints keep.

        Raises:
            ValueError: two callbacks share a stage, with what to pass instead.
        """
        name, mine = type(self).__name__, tuple(stage.value for stage in self.stages)
        for other in trainer.callbacks:  # type: ignore[attr-defined]
            if other is self or not isinstance(other, type(self)):
                continue
            theirs = tuple(stage.value for stage in other.stages)
            shared = [stage for stage in mine if stage in theirs]
            if shared or mine == theirs:
                both = ", ".join(map(repr, shared)) or "none"
                raise ValueError(
                    f"{name}: two {name}s in this Trainer time the same stage(s) ({both}: stages={mine!r} and "
                    f"stages={theirs!r}). A stage is timed by one callback only: give each its "
                    f'own stages= (e.g. {name}(stages="train") and {name}(stages="val")), or keep one callback.'
                )
        self._checked = True
