"""The cost model: the worker count it predicts instead of doubling."""

from __future__ import annotations

from lightning_dataperf.autotune.trial import Trial


def test_cost_model_predicts_the_worker_count_instead_of_doubling():
    from lightning_dataperf.autotune.model import MAX_JUMP, next_workers

    latency = Trial(4, 2, False, 50.0, batches=40, work_s=0.08, cpu_s=0.001, main_s=0.002, wait_share=0.9)
    assert next_workers(latency, limit=1000, cpus=2) == 4 * MAX_JUMP  # 500 batches/s x 80 ms: capped jump
    assert next_workers(latency, limit=10, cpus=2) == 10  # never past the bound
    near = Trial(10, 2, False, 100.0, batches=40, work_s=0.08, cpu_s=0.001, main_s=0.002, wait_share=0.9)
    assert next_workers(near, limit=11, cpus=2) == 11  # the 20% floor (12) is not allowed past the bound either
    # CPU-bound workers: 0.3 s of CPU per batch on 16 CPUs, the main thread busy 60%: ~51 batches/s at most,
    # x 0.3 s per batch x 1.15 headroom = 17.7 -> 18 workers (the old x1.5 step would have tried 15)
    compute = Trial(10, 2, True, 30.0, batches=60, work_s=0.3, cpu_s=0.3, main_s=0.009, wait_share=0.4)
    assert next_workers(compute, limit=100, cpus=16) == 18
    assert next_workers(Trial(4, 2, False, 50.0, worker_busy=0.9), limit=100) == 6  # no in-loader timing: x1.5
