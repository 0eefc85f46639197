"""The verdict's rules, one concern a module, and :data:`RULES`, the one ordered registry ``diagnose`` walks."""

from __future__ import annotations

from typing import Protocol

from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding
from lightning_dataperf.diagnosis.rules.compute import compute_bound
from lightning_dataperf.diagnosis.rules.epoch_start import epoch_start
from lightning_dataperf.diagnosis.rules.host import host_bound, host_gap
from lightning_dataperf.diagnosis.rules.input import input_bound
from lightning_dataperf.diagnosis.rules.memory import memory_pressure
from lightning_dataperf.diagnosis.rules.stalls import stalls
from lightning_dataperf.diagnosis.rules.straggler import straggler
from lightning_dataperf.diagnosis.rules.transfer import transfer_bound

__all__ = ["FALLBACK", "RULES", "Rule"]


class Rule(Protocol):
    """A verdict rule: one epoch's :class:`Evidence` in, its :class:`Finding` out, or ``None`` where it does
    not apply. A rule reads only the evidence (no I/O, no Lightning) and never raises for missing figures.

    Example::

        def my_rule(evidence: Evidence) -> Finding | None:
            share = ...  # the stage's share of evidence.step_mean
            return None if share < SIGNIFICANT_SHARE else Finding("my_kind", "headline", share, {}, ["advice"])
    """

    def __call__(self, evidence: Evidence, /) -> Finding | None: ...


#: Every rule ``diagnose`` applies, in order; findings of equal share keep this order in the verdict.
#: Support modules, no rules of their own: ``thresholds`` (SIGNIFICANT_SHARE), ``cores`` (CPU facts), ``decode``
#: (the GPU-decode cause, for ``input``), ``estimate`` (predicted gains, said to be estimates).
RULES: tuple[Rule, ...] = (
    # rules/input.py: the step waits for the loader; the cause from what was measured
    input_bound,
    # rules/transfer.py: the host-to-device copy costs the step
    transfer_bound,
    # rules/host.py: between steps (launches, syncs; loop overhead on the CPU), and inside them (host-gap probe)
    host_bound,
    host_gap,
    # rules/straggler.py: under DDP one rank waits far longer for data
    straggler,
    # rules/stalls.py: one or two long waits in a steady epoch
    stalls,
    # rules/epoch_start.py: worker spawn and first batches dominate a short epoch
    epoch_start,
    # rules/memory.py: swap, page faults, /dev/shm, pinned memory (a side note, share 0)
    memory_pressure,
)

#: rules/compute.py: put first where no rule in RULES found a bottleneck (the model itself is the limit).
FALLBACK: Rule = compute_bound
