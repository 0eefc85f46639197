"""What a user meets first in TensorBoard: the tag groups in the Time Series tab's order, the custom scalars."""

from __future__ import annotations

import functools
import sys

from helpers import ROOT, scalar_tags

from lightning_dataperf import tags
from lightning_dataperf.report.outputs import CUDA_CHARTS, CUSTOM_SCALARS, custom_scalars


def _tensorboard_compare(a: str, b: str) -> int:
    """TensorBoard 2.21's tag order (``compareTagNames`` in its web app, the Time Series tab's sort).

    Numbers compare by value, ``/`` and digits before every other character, the rest by character
    code (upper case before lower case). Ported from webfiles.zip's index.js; numbers are read as
    integers here (the tags compared hold no decimals).
    """
    i = j = 0
    while True:
        if i == len(a):
            return 0 if j == len(b) else -1
        if j == len(b):
            return 1
        if a[i].isdigit() and b[j].isdigit():
            i_end, j_end = i, j
            while i_end < len(a) and a[i_end].isdigit():
                i_end += 1
            while j_end < len(b) and b[j_end].isdigit():
                j_end += 1
            x, y = int(a[i:i_end]), int(b[j:j_end])
            if x != y:
                return -1 if x < y else 1
            i, j = i_end, j_end
            continue
        a_break, b_break = a[i] == "/" or a[i].isdigit(), b[j] == "/" or b[j].isdigit()
        if a_break and not b_break:
            return -1
        if b_break and not a_break:
            return 1
        if not a_break and a[i] != b[j]:
            return -1 if a[i] < b[j] else 1
        i, j = i + 1, j + 1


def tensorboard_groups(names) -> list[str]:
    """The Time Series tab's groups (a tag's first segment) in the order it shows them."""
    groups: list[str] = []
    for name in sorted(names, key=functools.cmp_to_key(_tensorboard_compare)):
        group = name.split("/", 1)[0]
        if group not in groups:
            groups.append(group)
    return groups


def test_tensorboard_compare_sorts_upper_case_and_slashes_first():
    assert tensorboard_groups(["System/a", "Time/b", "Epoch/c", "DataPerf/d"]) == [
        "DataPerf",
        "Epoch",
        "System",
        "Time",
    ]
    assert tensorboard_groups(["val/Time/x", "Workers/a", "Usage/b", "Transfer/c", "Time/d"]) == [
        "Time",
        "Transfer",
        "Usage",
        "Workers",
        "val",
    ]
    assert sorted(["Time/Step_max", "Time/Step"], key=functools.cmp_to_key(_tensorboard_compare)) == [
        "Time/Step",
        "Time/Step_max",
    ]


def test_quickstart_tags_open_on_the_time_group(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    sys.modules.pop("quickstart", None)
    import quickstart

    argv = ["--epochs", "2", "--samples", "192", "--sample-ms", "0.2", "--logdir", str(tmp_path)]
    perf = quickstart.main(argv)
    logged = set(scalar_tags(str(tmp_path / "quickstart" / "version_0")).Tags()["scalars"])
    groups = tensorboard_groups(logged)
    assert groups[0] == "Time", groups  # the first of the two groups TensorBoard opens
    assert set(groups) <= {"Time", "Transfer", "Usage", "Workers"}, groups
    for name in ("Time/DataLoading", "Time/Compute", "Time/DataLoading_p90", "Time/Compute_p90"):
        assert name in logged, name
    assert tags.time(tags.DATA_LOADING) + "_p90" == tags.epoch_percentile(tags.DATA_LOADING)
    removed = [name for name in logged if name.startswith(("Epoch/", "System/", "Loader/", "Throughput/", "DataPerf/"))]
    assert removed == []
    assert not [name for name in logged if name.endswith(("_mean", "_p50", "_p99")) and name.startswith("Time/")]
    assert "Time/StragglerRatio" not in logged and perf.summaries[-1].world_size == 1  # one rank: no straggler
    time_cards = [name for name in logged if name.startswith("Time/")]
    assert len(time_cards) <= 13, sorted(time_cards)


def test_custom_scalars_one_quantity_per_chart():
    charts = CUSTOM_SCALARS["DataPerf"]
    series = {title: patterns for title, (kind, patterns) in charts.items() if kind == "Multiline"}
    assert len(series) == len(charts)
    assert series["Time/DataLoading: data loading per step, mean and max (s)"] == [
        "^Time/DataLoading$",
        "^Time/DataLoading_max$",
    ]
    assert series["Time/Compute: compute per step, mean and max (s; CUDA: GPU busy, per epoch)"] == [
        "^Time/Compute$",
        "^Time/Compute_max$",
    ]
    assert series["Time/Step: step time, mean and max (s)"] == ["^Time/Step$", "^Time/Step_max$"]
    assert series["Time/InputStallFraction: share of step time lost to input"] == ["^Time/InputStallFraction$"]
    for title, patterns in series.items():  # each chart is named by its tag first
        assert title.split(":")[0] == patterns[0].strip("^$"), title
    assert series["Usage/cpu_busy_percent_mean: CPU busy, mean across cores (%)"] == ["^Usage/cpu_busy_percent_mean$"]
    for title, patterns in series.items():  # one quantity: a mean, or a mean and its maximum
        bases = {pattern.strip("^$").removesuffix("_max") for pattern in patterns}
        assert len(bases) == 1, (title, patterns)
    cpu = custom_scalars(cuda=False)["DataPerf"]
    assert set(cpu) == set(charts) - set(CUDA_CHARTS) and set(custom_scalars(cuda=True)["DataPerf"]) == set(charts)
