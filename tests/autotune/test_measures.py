"""A trial's side measurements: the gc freeze around it, the workers' CPU time and memory."""

from __future__ import annotations

import weakref

import pytest


def test_the_search_freezes_what_exists_even_under_a_freeze_made_earlier():
    import gc

    from lightning_dataperf.autotune.measures import gc_frozen

    if gc.get_freeze_count():
        pytest.skip("something in this process froze objects already")

    class Cycle:
        def __init__(self):
            self.me = self

    try:
        gc.freeze()  # a training script's own freeze before forking its workers
        made_after = [[index] for index in range(1000)]  # imported or built since: not frozen
        garbage = weakref.ref(Cycle())  # cyclic garbage made since, not yet collected
        before = gc.get_freeze_count()
        with gc_frozen():
            # the objects made since the earlier freeze are frozen too: a collection after a trial skips them
            assert gc.get_freeze_count() >= before + len(made_after)
            assert garbage() is None  # collected first, not frozen for good
        assert gc.get_freeze_count() >= before + len(made_after)  # the freeze in place stays
    finally:
        gc.unfreeze()
    with gc_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0  # a freeze of its own is undone at exit


def test_worker_cpu_counts_only_children_alive_at_the_end():
    import subprocess
    import sys
    import time

    from lightning_dataperf.autotune.measures import WorkerCpu

    # a plain child (multiprocessing's spawn would leave its resource tracker behind, a child of pytest) that
    # computes before it sleeps: CPU time is sampled in ticks, and a start of under one tick read 0 until it exited
    child = subprocess.Popen([sys.executable, "-c", "import time; sum(range(10**7)); time.sleep(30)"])
    try:
        cpu = WorkerCpu()
        deadline = time.monotonic() + 60
        while child.pid not in (before := cpu.seconds()) or before[child.pid] <= 0:  # its start and its sum
            assert time.monotonic() < deadline, "the child never showed CPU time"
            time.sleep(0.05)
    finally:
        child.terminate()
        child.wait()
    # a previous trial's worker that exited in between: summed naively, its CPU time is subtracted
    after = cpu.seconds()
    assert child.pid not in after
    naive = sum(after.values()) - sum(before.values())
    assert cpu.since(before) - naive == pytest.approx(before[child.pid], abs=0.05)


def test_a_trials_worker_memory_is_read_from_a_spread_sample_of_its_workers(monkeypatch):
    from types import SimpleNamespace

    from lightning_dataperf.autotune.measures import MEMORY_SAMPLE, WorkerCpu

    read = []

    def child(index):
        def memory_full_info():
            read.append(index)
            return SimpleNamespace(uss=(100 + index) * 2**20)

        return SimpleNamespace(pid=1000 + index, memory_full_info=memory_full_info)

    cpu = WorkerCpu()
    monkeypatch.setattr(cpu, "_children", lambda: [child(index) for index in range(64)])
    assert cpu.unique_mb() == 148.0  # the largest of those read: 0, 16, 32, 48
    assert read == [0, 16, 32, 48] and MEMORY_SAMPLE == 4
    read.clear()
    monkeypatch.setattr(cpu, "_children", lambda: [child(index) for index in range(3)])
    assert cpu.unique_mb() == 102.0 and read == [0, 1, 2]  # fewer than the sample: every one
