"""Issue 39: under a straggler the ranks' mean stall is mostly the straggler's wait; the verdict, which reads this
rank's loader, does not advise a change to a loader that hardly waits."""

from __future__ import annotations

import pytest

from lightning_dataperf.diagnosis.diagnose import diagnose
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.loader.stats import LoaderStats
from lightning_dataperf.timing.summary import EpochSummary, TimingSummary


def _timing(mean: float) -> TimingSummary:
    return TimingSummary(mean, mean, mean, mean, mean, 100)


def _two_ranks(waits: tuple[float, float], rank: int = 0) -> EpochSummary:
    """examples/ddp_cpu.py's epoch: rank 1's collate sleeps 30 ms; rank 0's loader takes 0.7 ms."""
    step = 0.0427
    return EpochSummary(
        stage="train",
        epoch=1,
        steps=32,
        timings={"DataLoading": _timing(sum(waits) / 2), "Compute": _timing(0.0245), "Step": _timing(step)},
        input_stall_fraction=sum(waits) / 2 / step,
        data_wait_share=sum(waits) / 2 / step,
        samples_per_sec=375.0,
        epoch_start=0.036,
        world_size=2,
        rank_data_wait=list(waits),
        slowest_rank=max(range(2), key=lambda index: waits[index]),
        straggler_ratio=max(waits) / max(min(waits), 1e-3),
        loader=LoaderStats(16, 16.0, 0.00049, 0.00014, 0.0, 0.0, 0.0, 0.0012, 0),
        rank=rank,
    )


def test_a_straggler_s_wait_is_not_called_this_rank_s_input_bound_loader():
    diagnosis = diagnose(Evidence(_two_ranks((0.0012, 0.0296)), LoaderFacts(num_workers=0), usable_cpus=2))
    kinds = [finding.kind for finding in diagnosis.findings]
    assert kinds[0] == "straggler", diagnosis.format()
    assert not any(kind.startswith("input_bound") for kind in kinds), diagnosis.format()
    assert "set num_workers" not in diagnosis.format()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_waits_itself_is_still_judged(rank):
    # both ranks wait a large share of the step: the loader this rank sees is part of the problem
    waits = (0.012, 0.0296) if rank == 0 else (0.0012, 0.0296)
    diagnosis = diagnose(Evidence(_two_ranks(waits, rank=rank), LoaderFacts(num_workers=0), usable_cpus=2))
    assert any(finding.kind.startswith("input_bound") for finding in diagnosis.findings), diagnosis.format()
