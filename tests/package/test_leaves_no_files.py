"""Issue 39: the suite writes nothing outside pytest's temporary folder. ``tests/conftest.py``'s session fixture
``leaves_no_files`` checks it for the whole run (the temporary folder every process of the run writes into, and the
checkout); these check the parts that used to leave files behind."""

from __future__ import annotations

import os
import tempfile

from lightning_dataperf.testing import loopback_ranks


def test_the_run_s_temporary_folder_is_its_own():
    # every process the tests start inherits TMPDIR: what they leave there is listed when the session ends
    assert os.path.basename(tempfile.gettempdir()).startswith("dataperf-tests-")
    assert os.environ["TMPDIR"] == tempfile.gettempdir()


def test_two_rank_launches_keep_no_log_folders():
    command, _ = loopback_ranks("script.py", "--out", "x")
    assert f"--log-dir={os.devnull}" in command  # the launcher made a torchelastic_* folder per launch otherwise
    assert command.index(f"--log-dir={os.devnull}") < command.index("script.py")
    command, _ = loopback_ranks("script.py", log_dir="/some/logs")
    assert "--log-dir=/some/logs" in command
