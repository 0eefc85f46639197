"""Issue 39: one naming scheme for every tag (README, "Metrics"), each tag defined once in ``tags.py``, figures that
are the workers' own logged only with workers, and no tag that repeats another."""

from __future__ import annotations

import re

import pytest

from lightning_dataperf import tags
from lightning_dataperf.loader.stats import LoaderStats
from lightning_dataperf.report.run import current_tag
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.transfer.stats import CopyStats

#: ``Time/`` CamelCase (seconds, or the unit at the end); the other groups snake_case ending in their unit
TIME = re.compile(r"^Time/(?:[A-Z][a-z]+)+(?:_max|_p90)?$")
UNITS = ("_s", "_fraction", "_percent", "_percent_mean", "_percent_max", "_mb", "_mbps", "_gbps", "_per_sec", "_ms")
COUNTS = {"runnable_tasks", "loader_workers_alive", "main_threads", "disk_read_iops", "gpu_sm_clock_mhz", "gpu_power_w"}
SHARES = {"gpu_slowdown", "gpu_power_capped", "gpu_clock_event_reasons"}  # 0-1 shares of readings, NVML's words


def _scalar_tags() -> list[str]:
    defined = [value for name, value in vars(tags).items() if name.isupper() and isinstance(value, str)]
    scalars = [tag for tag in defined if tag.count("/") == 1 and not tag.startswith("DataPerf/") and tag[-1] != "/"]
    scalars += [tags.time(name) for name in (*tags.TIMINGS, tags.HOST_GAP)]
    scalars += [tags.epoch_percentile(name) for name in tags.EPOCH_PERCENTILE_TIMINGS]
    return scalars + [SystemStats.tag(field) for field in SystemStats.fields()]


@pytest.mark.parametrize("tag", _scalar_tags())
def test_every_tag_follows_the_scheme(tag):
    group, name = tag.split("/")
    if group == "Time":
        assert TIME.match(tag), tag
        return
    assert group in {"Transfer", "Workers", "Usage"}, tag
    assert name == name.lower() and " " not in name, tag
    assert name.endswith(UNITS) or name in COUNTS | SHARES, f"{tag}: no unit at the end of its name"


def test_the_logged_figures_use_the_defined_tags():
    loader = LoaderStats(8, 4.0, 0.01, 0.001, 0.0, 0.002, 0.001, 0.004, workers=2, busy_fraction=0.9, work_cpu_s=0.005)
    copies = CopyStats(2, 0.002, 0.0005, 0.0, 0.75, 50.0)
    defined = set(_scalar_tags())
    for tag in (*loader.to_metrics(), *copies.to_metrics()):
        assert tag in defined, f"{tag} is logged but not defined in tags.py"


def test_figures_of_the_workers_are_logged_only_with_workers():
    alone = LoaderStats(8, 4.0, 0.01, 0.001, 0.0, 0.0, 0.0, 0.011, workers=0, work_cpu_s=0.009)
    assert set(alone.to_metrics()) == {tags.WORKERS_FETCH_S, tags.WORKERS_COLLATE_S, tags.WORKERS_PIN_S}
    two = LoaderStats(8, 4.0, 0.01, 0.001, 0.0, 0.002, 0.001, 0.004, workers=2, busy_fraction=0.9, work_cpu_s=0.005)
    assert {tags.WORKERS_WAIT_S, tags.WORKERS_HANDOVER_S, tags.WORKERS_BUSY, tags.WORKERS_CPU} <= set(two.to_metrics())
    mean = SystemStats.tag("worker_cpu_percent_mean")
    one = SystemStats(loader_workers_alive=1.0, workers_cpu_percent=40.0, worker_cpu_percent_mean=40.0)
    assert mean not in one.to_metrics() and SystemStats.tag("workers_cpu_percent") in one.to_metrics()
    assert (
        mean
        in SystemStats(loader_workers_alive=2.0, workers_cpu_percent=80.0, worker_cpu_percent_mean=40.0).to_metrics()
    )


@pytest.mark.parametrize(("old", "new"), sorted(tags.RENAMED.items()))
def test_runs_logged_under_the_old_names_still_draw(old, new):
    assert current_tag(old) == new and current_tag(f"val/{old}") == f"val/{new}"
    assert new in _scalar_tags()
