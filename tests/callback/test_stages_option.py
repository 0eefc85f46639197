"""``DataPerfCallback(stages=...)``: one stage name or several; a wrong one is refused with what to pass."""

from __future__ import annotations

import pytest

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.tags import Stage


def test_a_single_stage_name_is_one_stage_not_its_letters():
    assert DataPerfCallback(stages="train").stages == (Stage.TRAIN,)
    assert DataPerfCallback(stages=["val", "train"]).stages == (Stage.VAL, Stage.TRAIN)
    assert DataPerfCallback(stages=()).stages == ()


@pytest.mark.parametrize("stages", ["training", ("train", "valid"), 3, ("train", None)])
def test_a_wrong_stage_says_what_was_wrong_and_what_to_pass(stages):
    with pytest.raises(ValueError, match=r"DataPerfCallback: stages=") as error:
        DataPerfCallback(stages=stages)
    assert "'train', 'val', 'test', 'predict'" in str(error.value) and 'stages="train"' in str(error.value)
