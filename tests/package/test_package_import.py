"""``import lightning_dataperf`` is cheap (exports load on first use) and still registers the strategies."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import ROOT

import lightning_dataperf


def _python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_loads_no_torch_until_an_export_is_used():
    code = (
        "import sys, lightning_dataperf\n"
        "print('torch' in sys.modules, 'lightning' in sys.modules)\n"
        "lightning_dataperf.DataPerfCallback\n"
        "print('torch' in sys.modules, 'lightning' in sys.modules)"
    )
    assert _python(code).splitlines() == ["False False", "True True"]


@pytest.mark.parametrize("order", ["package first", "lightning first", "lightning umbrella first"])
def test_import_registers_the_side_stream_strategies(order):
    imports = {
        "package first": "import lightning_dataperf\nimport lightning.pytorch as pl",
        "lightning first": "import lightning.pytorch as pl\nimport lightning_dataperf",
        "lightning umbrella first": "import lightning_dataperf\nimport lightning\nimport lightning.pytorch as pl",
    }[order]
    code = (
        f"{imports}\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "print('side_stream' in StrategyRegistry, 'ddp_side_stream' in StrategyRegistry)\n"
        "trainer = pl.Trainer(strategy='side_stream', accelerator='cpu', devices=1, logger=False,\n"
        "                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)\n"
        "print(type(trainer.strategy).__name__)"
    )
    assert _python(code).splitlines()[-2:] == ["True True", "SideStreamStrategy"]


def test_every_export_resolves_and_star_import_works():
    assert "__version__" in lightning_dataperf.__all__
    for name in lightning_dataperf.__all__:
        assert getattr(lightning_dataperf, name) is not None, name
    assert set(lightning_dataperf.__all__) - {"__version__"} == set(lightning_dataperf._EXPORTS)
    namespace: dict = {}
    exec("from lightning_dataperf import *", namespace)
    assert namespace["DataPerfCallback"] is lightning_dataperf.callback.callback.DataPerfCallback
    assert set(dir(lightning_dataperf)) >= set(lightning_dataperf.__all__)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        lightning_dataperf.NoSuchThing  # noqa: B018


def test_importing_a_submodule_first_still_registers_the_strategies():
    # loader_probe imports lightning itself; registering then must not hit a half-imported package module
    code = (
        "import warnings; warnings.simplefilter('error', RuntimeWarning)\n"
        "import lightning_dataperf.loader.probe\n"
        "import lightning.pytorch as pl\n"
        "trainer = pl.Trainer(strategy='side_stream', accelerator='cpu', logger=False, enable_progress_bar=False)\n"
        "print(type(trainer.strategy).__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("SideStreamStrategy")
