"""The transfer-bound rule: the host-to-device copy costs the step (stock, or the side stream's copy exposed)."""

from __future__ import annotations

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding
from lightning_dataperf.diagnosis.rules.thresholds import SIGNIFICANT_SHARE

__all__ = ["PCIE_SATURATED", "transfer_bound"]

#: Share of the link's capacity above which PCIe counts as saturated: the capacity is the lanes' rate after line
#: encoding, and packet headers take roughly another fifth of it, so a copy at 80% is near what the link gives.
PCIE_SATURATED = 0.8


def transfer_bound(evidence: Evidence) -> Finding | None:
    """The copy costs the step: on the compute stream (stock), or the side stream's copy left exposed.

    Example::

        finding = transfer_bound(evidence)
        finding.kind          # "transfer_bound"
    """
    if not evidence.summary.on_device:
        return None  # no device copy to speak of: CPU runs have no host-to-device transfer
    step, copies = evidence.step_mean, evidence.summary.copies
    # Side stream: what the compute stream waited for, not the copy itself (mostly hidden behind compute).
    transfer = copies.exposed_s if copies is not None else evidence.timing(tags.TRANSFER)
    if transfer is None or not step:
        return None
    share = transfer / step
    if share < SIGNIFICANT_SHARE:
        return None
    numbers = {"transfer_ms": 1e3 * transfer, "step_ms": 1e3 * step, "transfer_share": share}
    if copies is not None:
        numbers["transfer_copy_ms"] = 1e3 * copies.copy_s
        numbers["transfer_hidden_fraction"] = copies.hidden_fraction
    rx = evidence.system.gpu_pcie_rx_mbps
    if rx is not None:
        numbers["gpu_pcie_rx_mbps"] = rx
    saturated = rx is not None and evidence.pcie_capacity_mbps and rx > PCIE_SATURATED * evidence.pcie_capacity_mbps
    advice = []
    if evidence.loader.pin_memory is False:
        advice.append(
            "the loader has pin_memory=False: unless your dataset returns pinned tensors, copies come from pageable "
            "memory and the driver stages them synchronously; set pin_memory=True"
        )
    if not evidence.side_stream_transfer:
        advice.append(
            "overlap the copy with compute: Trainer(strategy='side_stream') copies the next batch on a "
            "side CUDA stream while this one computes"
        )
    if saturated:
        numbers["pcie_capacity_mbps"] = float(evidence.pcie_capacity_mbps or 0.0)
        advice.append("PCIe is saturated: only fewer bytes help (uint8 instead of float32, crop before the copy)")
    advice.append("ship compact dtypes (uint8 images) and cast/normalise on the GPU: 4x fewer PCIe bytes")
    cause = "PCIe saturated" if saturated else "copies not overlapped with compute"
    return Finding(
        kind="transfer_bound",
        headline=f"transfer-bound ({cause}): the host-to-device copy costs {100 * share:.0f}% of the step",
        share=share,
        evidence=numbers,
        advice=advice,
    )
