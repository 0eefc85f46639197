"""One rule, tested alone and through ``diagnose``: memory pressure (the template for a new rule's tests)."""

from __future__ import annotations

from evidence_fakes import INPUT_BOUND, summary

from lightning_dataperf.diagnosis.diagnose import diagnose
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.rules.memory import SHM_FREE_MB, SWAP_USED_MB, memory_pressure
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.telemetry.stats import SystemStats


def test_memory_pressure_names_each_figure_past_its_threshold():
    pressed = SystemStats(swap_used_mb=SWAP_USED_MB + 1, shm_free_mb=SHM_FREE_MB - 1, major_faults_per_sec=5.0)
    finding = memory_pressure(Evidence(summary(Compute=0.01, Step=0.01), system=pressed))
    assert finding is not None and finding.kind == "memory_pressure" and finding.share == 0.0
    assert finding.evidence == {"swap_used_mb": SWAP_USED_MB + 1, "shm_free_mb": SHM_FREE_MB - 1}
    assert finding.headline == "memory pressure: swap_used_mb=257, shm_free_mb=255"
    assert any("/dev/shm" in advice for advice in finding.advice)


def test_memory_pressure_stays_silent_at_its_thresholds_and_without_telemetry():
    calm = SystemStats(swap_used_mb=SWAP_USED_MB, shm_free_mb=SHM_FREE_MB, pinned_host_mb=10.0, ram_available_mb=10.0)
    assert memory_pressure(Evidence(summary(Compute=0.01, Step=0.01), system=calm)) is None
    assert memory_pressure(Evidence(summary(Compute=0.01, Step=0.01))) is None  # telemetry off: nothing sampled


def test_memory_pressure_is_a_side_note_never_the_bottleneck():
    pressed = SystemStats(swap_used_mb=4096.0)
    verdict = diagnose(Evidence(INPUT_BOUND, LoaderFacts(num_workers=0), system=pressed))
    kinds = [finding.kind for finding in verdict.findings]
    assert kinds[0] != "memory_pressure" and kinds[-1] == "memory_pressure"
