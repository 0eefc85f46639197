"""The command line as a user meets it: the installed entry point answers --help and argument errors at
once, probe refuses arguments it cannot honour, report draws one named run (TensorBoard or CSV logs)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time

import lightning.pytorch as pl
import pytest
from helpers import ROOT, SleepyModel, sleepy_loader, trainer_kwargs
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.cli import main
from lightning_dataperf.report.run import COLOURS, LABELS, TAGS, RunData, load_run, render_figure
from lightning_dataperf.telemetry.hardware import usable_cpus


def _entry_point() -> str:
    """``module:function`` of the ``lightning-dataperf`` console script, as the installed metadata declares it."""
    scripts = importlib.metadata.entry_points(group="console_scripts")
    return next(
        (script.value for script in scripts if script.name == "lightning-dataperf"), "lightning_dataperf.cli:main"
    )


def cli(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the console script's function in a fresh interpreter on this checkout, as the script does."""
    module, function = _entry_point().split(":")
    code = f"import sys; sys.argv[0] = 'lightning-dataperf'; from {module} import {function}; sys.exit({function}())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


# --- --help and argument errors: fast, plain text, nothing heavy imported ----------------------------------


def test_importing_the_cli_imports_neither_torch_nor_lightning():
    code = (
        "import sys, lightning_dataperf, lightning_dataperf.cli; "
        "print(sorted(m for m in ('torch', 'lightning', 'matplotlib', 'tensorboard') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "[]"


def test_help_answers_at_once_in_plain_text():
    cli("--help")  # warm the file cache; the bound below is for the second call
    start = time.perf_counter()
    result = cli("--help")
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert elapsed < 2.5, f"--help took {elapsed:.2f} s (it imports torch/Lightning before parsing?)"
    assert "probe" in result.stdout and "report" in result.stdout
    for command in ("probe", "report"):
        sub = cli(command, "--help")
        assert sub.returncode == 0
        for markup in ("``", ":class:", ":func:", "::"):
            assert markup not in result.stdout + sub.stdout, f"reST markup {markup!r} in the help text"


def test_argument_errors_answer_at_once_with_exit_code_2():
    start = time.perf_counter()
    result = cli("frobnicate")
    assert time.perf_counter() - start < 2.5
    assert result.returncode == 2 and "invalid choice" in result.stderr


# --- probe ------------------------------------------------------------------------------------------------


def test_probe_prints_hardware_and_reasons(capsys, tmp_path):
    assert main(["probe", "--data-path", str(tmp_path), "--epochs", "5"]) == 0
    out = capsys.readouterr().out
    assert "usable" in out and "num_workers=" in out and "Storage of" in out
    ranks = min(2, usable_cpus()[0])
    assert main(["probe", "--json", "--local-world-size", str(ranks)]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["hardware"]["local_world_size"] == ranks
    assert set(payload["settings"]) >= {"num_workers", "pin_memory", "persistent_workers", "reasons"}


def test_probe_refuses_a_missing_data_path(tmp_path):
    missing = tmp_path / "no-such-dataset"
    result = cli("probe", "--data-path", str(missing))
    assert result.returncode == 2 and result.stdout == ""
    assert f"--data-path {missing}: no such file or directory" in result.stderr
    assert "leave --data-path out" in result.stderr  # says what to do


@pytest.mark.parametrize("ranks", ["0", "-1", "too_many"])
def test_probe_refuses_a_local_world_size_it_cannot_honour(ranks):
    cpus, _ = usable_cpus()
    if ranks == "too_many":
        ranks = str(cpus + 1)
    result = cli("probe", "--local-world-size", ranks)
    assert result.returncode == 2 and result.stdout == ""
    if int(ranks) < 1:
        assert f"--local-world-size {ranks}: must be at least 1" in result.stderr
    else:
        assert f"more ranks than the {cpus} CPU(s) this process may use" in result.stderr
        assert f"Pass at most {cpus}" in result.stderr


def test_probe_accepts_as_many_ranks_as_usable_cpus(capsys):
    cpus, _ = usable_cpus()
    assert main(["probe", "--json", "--local-world-size", str(cpus)]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"]["cpus_per_rank"] == 1


def test_probe_refuses_zero_epochs():
    result = cli("probe", "--epochs", "0")
    assert result.returncode == 2 and "--epochs 0: must be at least 1" in result.stderr


# --- report -----------------------------------------------------------------------------------------------


def _fit(tmp_path, logger, **callback_kwargs):
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.05, **callback_kwargs)
    kwargs = trainer_kwargs(tmp_path)
    trainer = pl.Trainer(max_epochs=2, callbacks=[perf], log_every_n_steps=2, logger=logger, **kwargs)
    trainer.fit(SleepyModel(), sleepy_loader(48, 4, 0.01))
    return trainer


def test_report_draws_a_png_and_html_from_a_cpu_run(tmp_path, capsys):
    trainer = _fit(tmp_path, TensorBoardLogger(str(tmp_path), name="exp"))
    out = tmp_path / "report.png"
    assert main(["report", trainer.logger.log_dir, "--out", str(out), "--html"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    page = out.with_suffix(".html").read_text()
    assert "data:image/png;base64," in page and "DataPerf verdict (train epoch 1)" in page
    printed = capsys.readouterr().out
    assert "input-bound" in printed and "TensorBoard events" in printed
    assert "loader per batch: fetch" in printed and "loader per batch: fetch" in page  # the loader's inside
    assert "input_bound" not in printed + page, "the verdict in plain words, not the finding's id"

    run = load_run(trainer.logger.log_dir)
    figure = render_figure(run)
    labels = {}  # legend text -> colour, over every panel
    for axes in figure.axes:
        for artist in [*axes.lines, *axes.collections, *axes.patches]:
            label = artist.get_label()
            if label and not label.startswith("_"):
                labels.setdefault(label, set()).add(_colour_of(artist))
    assert {LABELS["data_wait"], LABELS["compute"], LABELS["cpu_busy"]} <= set(labels)
    assert set(labels) <= set(LABELS.values()), "every legend entry uses README's words"
    assert not any("/" in label.split(":")[0] or "_" in label for label in labels), "no internal tag ids"
    by_label = {LABELS[key]: key for key in LABELS}
    for label, colours in labels.items():
        assert colours == {_hex(COLOURS[by_label[label]])}, f"{label} is drawn in {colours}"
    assert len(set(COLOURS.values())) == len(COLOURS), "two metrics share a colour"


def _hex(colour) -> str:
    from matplotlib.colors import to_hex

    return to_hex(colour)


def _colour_of(artist) -> str:
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D

    if isinstance(artist, Line2D):
        return _hex(artist.get_color())
    if isinstance(artist, Collection):
        return _hex(artist.get_facecolor()[0])
    return _hex(artist.get_facecolor())


def test_report_on_a_directory_without_data_says_what_to_do(tmp_path):
    result = cli("report", str(tmp_path))
    assert result.returncode == 2 and "holds no DataPerf data" in result.stderr
    result = cli("report", str(tmp_path / "missing"))
    assert result.returncode == 2 and "is not a directory" in result.stderr


def _two_logged_runs(tmp_path):
    """Two real TensorBoard runs of one logger, version_0 (data wait 30 ms) then version_1 (10 ms)."""
    for wait in (0.030, 0.010):
        logger = TensorBoardLogger(str(tmp_path), name="exp")
        for step in range(1, 6):
            logger.log_metrics({TAGS["data_wait"]: wait, TAGS["compute"]: 0.004, TAGS["transfer"]: 0.0}, step)
        logger.finalize("success")
    folder = tmp_path / "exp"
    assert sorted(path.name for path in folder.iterdir()) == ["version_0", "version_1"]
    return folder


def test_report_on_two_runs_draws_the_latest_and_names_the_other(tmp_path):
    folder = _two_logged_runs(tmp_path)
    out = tmp_path / "two.png"
    result = cli("report", str(folder), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "drew run version_1" in result.stdout and "latest of 2" in result.stdout
    assert "not drawn: version_0" in result.stdout and "--run NAME" in result.stdout
    assert out.stat().st_size > 10_000

    run = load_run(folder)
    assert run.name == "version_1" and run.other_runs == ["version_0"]
    assert [value for _, value in run.series("data_wait")] == pytest.approx([0.010] * 5), "one run, not overlaid"
    title = render_figure(run)._suptitle.get_text()
    assert "run version_1" in title and "version_0" in title


def test_report_latest_run_is_the_most_recently_written(tmp_path):
    folder = _two_logged_runs(tmp_path)
    later = time.time() + 60
    for path in (folder / "version_0").iterdir():
        os.utime(path, (later, later))
    run = load_run(folder)
    assert run.name == "version_0" and run.other_runs == ["version_1"]


def test_report_run_picks_one_and_an_unknown_run_is_an_error(tmp_path):
    folder = _two_logged_runs(tmp_path)
    result = cli("report", str(folder), "--run", "version_0", "--out", str(tmp_path / "zero.png"))
    assert result.returncode == 0, result.stderr
    assert "drew run version_0" in result.stdout and "not drawn: version_1" in result.stdout
    assert [value for _, value in load_run(folder, run="version_0").series("data_wait")] == pytest.approx([0.03] * 5)
    assert load_run(tmp_path, run="exp/version_1").name == "exp/version_1"  # from a level up, by path

    result = cli("report", str(folder), "--run", "version_7")
    assert result.returncode == 2 and result.stdout == ""
    assert "--run version_7 names no run" in result.stderr and "version_0, version_1" in result.stderr


def test_report_draws_a_csv_only_run_from_its_metrics_csv(tmp_path):
    trainer = _fit(tmp_path, CSVLogger(str(tmp_path), name="csv"))
    log_dir = trainer.logger.log_dir
    assert not list(tmp_path.rglob("events.out.tfevents.*")) and os.path.exists(os.path.join(log_dir, "metrics.csv"))

    run = load_run(log_dir)
    assert run.sources == ["metrics.csv"]
    for key in ("data_wait", "transfer", "compute", "cpu_busy", "main_cpu"):
        assert run.series(key), f"{TAGS[key]} not read from metrics.csv"
    assert all(value > 0.005 for _, value in run.series("data_wait"))  # the loader sleeps 10 ms per batch
    timeline, stall, device = render_figure(run).axes[:3]
    assert timeline.collections and all(len(layer.get_paths()[0].vertices) > 2 for layer in timeline.collections)
    assert stall.patches and device.lines and not any(text.get_text().startswith("no ") for text in device.texts)

    out = tmp_path / "csv.png"
    result = cli("report", log_dir, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "(metrics.csv)" in result.stdout and "input-bound" in result.stdout


def test_report_panels_without_data_say_what_is_missing(tmp_path):
    run = RunData(tmp_path, scalars={TAGS["compute"]: [(1, 0.004), (2, 0.004)]})
    timeline, stall, device = render_figure(run).axes[:3]
    assert timeline.collections
    assert any("no epoch summaries" in text.get_text() for text in stall.texts)
    assert any("no Usage/ telemetry" in text.get_text() for text in device.texts)


def test_report_gpu_panel_uses_the_metric_table_words(tmp_path):
    steps = [(1, 50.0), (2, 80.0)]
    scalars = {TAGS["compute"]: [(1, 0.004), (2, 0.004)], TAGS["device_idle"]: [(1, 0.001), (2, 0.002)]}
    scalars |= {TAGS["gpu_util"]: steps, TAGS["pcie_rx"]: [(1, 9000.0), (2, 12000.0)]}
    figure = render_figure(RunData(tmp_path, scalars=scalars))
    labels = {line.get_label(): _colour_of(line) for axes in figure.axes for line in axes.lines}
    for key in ("device_idle", "gpu_util", "pcie_rx"):
        assert labels[LABELS[key]] == _hex(COLOURS[key])
    ylabels = {axes.get_ylabel() for axes in figure.axes}
    assert "PCIe bytes into the GPU (MB/s)" in ylabels and "GPU utilisation (%)" in ylabels


def test_report_reads_each_event_file_of_a_run_once(tmp_path):
    for first_step in (1, 6):  # a resumed run: two event files in one version folder
        logger = TensorBoardLogger(str(tmp_path), name="exp", version=0)
        for step in range(first_step, first_step + 5):
            logger.log_metrics({TAGS["data_wait"]: 0.01, TAGS["compute"]: 0.004}, step)
        logger.finalize("success")
    assert len(list((tmp_path / "exp" / "version_0").glob("events.out.tfevents.*"))) == 2
    assert [step for step, _ in load_run(tmp_path / "exp").series("compute")] == list(range(1, 11))


def test_report_reads_runs_logged_with_earlier_tag_names():
    from lightning_dataperf.report.run import current_tag

    assert current_tag("System/gpu_pcie_rx_MBps") == "Usage/gpu_pcie_rx_mbps"
    assert current_tag("System/main_rss_MB") == "Usage/main_rss_mb"
    assert current_tag("DataPerf/input_stall_fraction") == "Time/InputStallFraction"
    assert (
        current_tag("Time/samples_per_sec") == "Time/SamplesPerSec"
        and current_tag("Transfer/GBps") == "Transfer/copy_gbps"
    )
    assert current_tag("val/Time/input_stall_fraction") == "val/Time/InputStallFraction"
    assert current_tag("Time/Compute") == "Time/Compute"
    assert current_tag("System/not_a_field") == "System/not_a_field"
