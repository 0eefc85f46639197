"""The host-gap arithmetic on profiler events (CPU; the real profiler is checked on a GPU in test_cuda_host_gap)."""

from types import SimpleNamespace

import pytest

from lightning_dataperf.timing.host_gap import HostGapProbe, _stats, split_device_span

MS = 1_000_000


def event(name, device, correlation, start_ms, duration_ms=0.0, thread=1):
    return SimpleNamespace(
        device_resource_id=lambda: thread,
        name=lambda: name,
        device_type=lambda: f"DeviceType.{device}",
        correlation_id=lambda: correlation,
        start_ns=lambda: int(start_ms * MS),
        duration_ns=lambda: int(duration_ms * MS),
    )


def test_union_of_overlapping_intervals():
    assert split_device_span([]) == (0, 0)
    assert split_device_span([(0, 2), (1, 3), (6, 8)]) == (8, 5)  # [0, 3] and [6, 8]: busy 5 of 8


def test_kernels_are_assigned_to_the_step_that_launched_them():
    events = [
        # step 0 (host window 0-10 ms): two 2 ms kernels with a 4 ms wait for the host between them
        event("cudaLaunchKernel", "CPU", 1, 0.5),
        event("spin_kernel", "CUDA", 1, 1.0, 2.0),
        event("cudaLaunchKernel", "CPU", 2, 6.5),
        event("spin_kernel", "CUDA", 2, 7.0, 2.0),
        # step 1 (host window 20-30 ms): back-to-back work, no gap
        event("cudaLaunchKernel", "CPU", 3, 20.5),
        event("gemm", "CUDA", 3, 21.0, 3.0),
        event("cudaMemcpyAsync", "CPU", 4, 20.6),
        event("Memcpy HtoD", "CUDA", 4, 24.0, 1.0),
        event("aten::mm", "CPU", 99, 20.4),  # a CPU op: neither launch nor device work
    ]
    stats = _stats(events, [(0, 10 * MS), (20 * MS, 30 * MS)], first_step=7)
    assert stats.steps == 2 and stats.first_step == 7
    assert stats.span_s == pytest.approx((0.008 + 0.004) / 2)
    assert stats.gpu_busy_s == pytest.approx((0.004 + 0.004) / 2)
    assert stats.host_gap_s == pytest.approx(0.002)
    assert stats.gap_share == pytest.approx(0.002 / 0.006)


def test_work_on_other_threads_streams_is_not_the_steps_but_its_backward_thread_is():
    """A decode thread on its own stream (99) is left out; autograd's thread (33) launching on the step's stream (7)
    is the step's backward pass and counts. Resource ids: a launch's is its thread, a kernel's its stream."""
    events = [
        event("cudaLaunchKernel", "CPU", 1, 0.5, thread=11),
        event("forward_kernel", "CUDA", 1, 1.0, 2.0, thread=7),
        event("cudaLaunchKernel", "CPU", 2, 1.0, thread=-22),  # the decode thread (a signed int32 resource id)
        event("decode_kernel", "CUDA", 2, 3.0, 5.0, thread=99),
        event("cudaLaunchKernel", "CPU", 3, 6.5, thread=33),  # autograd's device thread
        event("backward_kernel", "CUDA", 3, 8.0, 1.0, thread=7),
    ]
    windows = [(0, 10 * MS)]
    ours = _stats(events, windows, first_step=0, threads=frozenset({11}))
    assert ours.gpu_busy_s == pytest.approx(0.003) and ours.span_s == pytest.approx(0.008)
    # under DDP autograd's thread also queues the all-reduce on NCCL's stream (8): the step's work too
    nccl = [
        *events,
        event("cudaLaunchKernel", "CPU", 4, 7.0, thread=33),
        event("allreduce", "CUDA", 4, 9.0, 0.5, thread=8),
    ]
    assert _stats(nccl, windows, first_step=0, threads=frozenset({11})).gpu_busy_s == pytest.approx(0.0035)
    assert not ours.other_threads_kept
    decode = _stats(events, windows, 0, threads=frozenset({-22 & 0xFFFFFFFF}))  # seen from the decode thread
    assert decode.gpu_busy_s == pytest.approx(0.005)
    unknown = _stats(events, windows, first_step=0, threads=frozenset({44}))  # ids not recognised: say so
    assert unknown.gpu_busy_s == pytest.approx(0.008) and unknown.other_threads_kept
    assert "thread ids not recognised" in unknown.format()


def test_probe_without_cuda_profiling_turns_itself_off_with_one_warning(monkeypatch):
    probe = HostGapProbe(start_step=0, steps=1)

    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI not available")

    monkeypatch.setattr("torch.profiler.profile", broken)
    with pytest.warns(UserWarning, match="host-gap probe is off"):
        probe.step_started(0)
    assert probe.disabled and not probe.active and probe.step_finished(0) is False
    probe.step_started(1)  # no second warning, no profiler
    assert probe.result() is None
    with pytest.raises(ValueError, match="steps >= 1"):
        HostGapProbe(steps=0)
