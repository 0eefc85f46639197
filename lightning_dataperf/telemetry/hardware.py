"""What this process really has to work with: CPUs, GPUs, memory, ``/dev/shm`` and storage.

``os.cpu_count()`` is the machine's count; affinity, a cgroup quota and SLURM each cap it (docs/telemetry.md).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "GpuInfo",
    "Hardware",
    "StorageInfo",
    "block_device_of",
    "default_start_method",
    "local_world_size",
    "pcie_capacity_mbps",
    "probe_hardware",
    "trainer_ranks",
    "usable_cpus",
]

_NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "fuse.sshfs"}
_NETWORK_FILESYSTEMS |= {"glusterfs", "fuse.glusterfs", "9p", "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs", "wekafs"}


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it (``pcie_*`` are the current link, ``None`` when unknown)."""

    index: int
    name: str
    memory_total_mb: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None


@dataclass(frozen=True)
class StorageInfo:
    """The block device and file system behind a path."""

    path: str
    filesystem: str | None = None
    device: str | None = None
    rotational: bool | None = None
    nvme: bool = False
    network: bool = False

    @property
    def kind(self) -> str:
        if self.network:
            return "network"
        if self.filesystem in {"tmpfs", "ramfs"}:
            return "memory"
        if self.nvme:
            return "nvme"
        if self.rotational is True:
            return "hdd"
        if self.rotational is False:
            return "ssd"
        return "unknown"


@dataclass(frozen=True)
class Hardware:
    """A snapshot of the resources this process may use.

    ``usable_cpus`` is already the minimum of affinity, cgroup quota and ``SLURM_CPUS_PER_TASK``;
    ``usable_cpus_source`` names the limit that won.

    Example::

        hardware = probe_hardware("/data")
        print(hardware.cpus_per_rank, hardware.storage.kind, [gpu.name for gpu in hardware.gpus])
    """

    logical_cpus: int
    physical_cpus: int | None
    usable_cpus: int
    usable_cpus_source: str
    local_world_size: int
    gpus: tuple[GpuInfo, ...] = ()
    accelerator: str = "cpu"
    ram_total_mb: float = 0.0
    ram_available_mb: float = 0.0
    shm_total_mb: float | None = None
    shm_free_mb: float | None = None
    start_method: str = "fork"
    storage: StorageInfo | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def cpus_per_rank(self) -> int:
        """Usable CPUs divided among the ranks of this node (at least one)."""
        return max(1, self.usable_cpus // max(1, self.local_world_size))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpus_per_rank"] = self.cpus_per_rank
        if self.storage is not None:
            data["storage"]["kind"] = self.storage.kind
        return data


def cgroup_cpu_limit(root: str | os.PathLike[str] = "/sys/fs/cgroup") -> float | None:
    """CPUs allowed by the cgroup CPU quota (v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``), ``None`` if unlimited."""
    root = Path(root)
    v2 = root / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().strip().partition(" ")
        if quota == "max" or not period:
            return None
        return int(quota) / int(period)
    for folder in (root / "cpu", root / "cpu,cpuacct", root):
        quota_file, period_file = folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"
        if quota_file.is_file() and period_file.is_file():
            quota, period = int(quota_file.read_text()), int(period_file.read_text())
            return None if quota <= 0 or period <= 0 else quota / period
    return None


def slurm_cpu_limit(environ: dict[str, str] | os._Environ[str] | None = None) -> int | None:
    """``SLURM_CPUS_PER_TASK`` when running inside a SLURM job step."""
    environ = os.environ if environ is None else environ
    value = environ.get("SLURM_CPUS_PER_TASK")
    if not value:
        return None
    try:
        return max(1, int(value))
    except ValueError:
        return None


def affinity_cpus() -> int | None:
    """CPUs in this process's affinity mask (Linux), ``None`` where the OS cannot tell."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return None


def usable_cpus(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup") -> tuple[int, str]:
    """The CPUs this process may use, and which limit decided it."""
    candidates: list[tuple[float, str]] = [(float(os.cpu_count() or 1), "os.cpu_count()")]
    if (affinity := affinity_cpus()) is not None:
        candidates.append((float(affinity), "CPU affinity"))
    try:
        if (quota := cgroup_cpu_limit(cgroup_root)) is not None:
            candidates.append((quota, "cgroup CPU quota"))
    except (OSError, ValueError):
        pass
    if (slurm := slurm_cpu_limit()) is not None:
        candidates.append((float(slurm), "SLURM_CPUS_PER_TASK"))
    value, source = min(candidates, key=lambda candidate: candidate[0])
    return max(1, math.floor(value)), source


def local_world_size(environ: dict[str, str] | os._Environ[str] | None = None, ranks: int | None = None) -> int:
    """Ranks on this node: ``ranks`` where the caller knows them (a Trainer's ``num_devices``), else torchrun's or
    SLURM's environment variables (1 if none).

    Lightning's own launcher (``Trainer(devices=2, strategy="ddp")`` started as ``python train.py``) sets neither
    variable, so only the trainer knows its ranks.

    Example::

        local_world_size(ranks=trainer.num_devices)   # 2 under devices=2, whatever the environment says
    """
    if ranks is not None:
        return max(1, int(ranks))
    environ = os.environ if environ is None else environ
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = environ.get(name, "")
        if value.split("(")[0].isdigit():
            return max(1, int(value.split("(")[0]))
    return 1


def trainer_ranks(trainer: Any) -> int | None:
    """The ranks per node a Lightning ``Trainer`` runs (its ``num_devices``); ``None`` without a trainer.

    Example::

        probe_hardware(local_ranks=trainer_ranks(trainer))
    """
    ranks = getattr(trainer, "num_devices", None)
    return ranks if isinstance(ranks, int) else None


def probe_gpus() -> tuple[GpuInfo, ...]:
    """GPUs through NVML; an empty tuple when NVML or a driver is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return ()
    try:
        return tuple(_gpu_info(pynvml, index) for index in range(pynvml.nvmlDeviceGetCount()))
    except Exception:
        return ()
    finally:
        pynvml.nvmlShutdown()


def _gpu_info(nvml: Any, index: int) -> GpuInfo:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = nvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else str(name)
    memory = _safe(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20)
    generation = _safe(lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
    width = _safe(lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
    return GpuInfo(index, name, memory, generation, width)


def _safe(read: Any) -> Any:
    try:
        return read()
    except Exception:
        return None


#: Usable bytes per second per lane of each PCIe generation, in MB/s (after line encoding).
_PCIE_LANE_MBPS = {1: 250.0, 2: 500.0, 3: 985.0, 4: 1969.0, 5: 3938.0, 6: 7563.0}


def pcie_capacity_mbps(gpu: GpuInfo) -> float | None:
    """One-direction capacity of the GPU's current PCIe link (MB/s), ``None`` if unknown."""
    if gpu.pcie_generation not in _PCIE_LANE_MBPS or not gpu.pcie_width:
        return None
    return _PCIE_LANE_MBPS[gpu.pcie_generation] * gpu.pcie_width


def probe_storage(path: str | os.PathLike[str], mounts_file: str = "/proc/self/mounts") -> StorageInfo:
    """File system type and block device of ``path`` (rotational or not, NVMe, network)."""
    path = os.path.realpath(path)
    filesystem, source = _mount_of(path, mounts_file)
    device = block_device_of(path)
    rotational = None
    if device is not None:
        flag = Path("/sys/block", device, "queue", "rotational")
        rotational = flag.read_text().strip() == "1" if flag.is_file() else None
    network = filesystem in _NETWORK_FILESYSTEMS or (source or "").startswith("//")
    nvme = device is not None and device.startswith("nvme")
    return StorageInfo(path, filesystem, device, rotational, nvme, network)


def _mount_of(path: str, mounts_file: str) -> tuple[str | None, str | None]:
    best: tuple[int, str | None, str | None] = (-1, None, None)
    try:
        lines = Path(mounts_file).read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        source, mount_point, filesystem = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > best[0]:
            best = (len(mount_point), filesystem, source)
    return best[1], best[2]


def block_device_of(path: str | os.PathLike[str]) -> str | None:
    """The whole-disk name (``vda``, ``nvme0n1``) holding ``path``, ``None`` for virtual file systems."""
    try:
        device = os.stat(os.path.realpath(path)).st_dev
    except OSError:
        return None
    sysfs = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
    if not sysfs.exists():
        return None
    resolved = sysfs.resolve()
    if (resolved / "partition").is_file():
        resolved = resolved.parent
    return resolved.name


def shm_usage(path: str = "/dev/shm") -> tuple[float, float] | None:
    """Total and free MB of the shared-memory file system that DataLoader workers pass batches through."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return usage.total / 2**20, usage.free / 2**20


def probe_hardware(
    data_path: str | os.PathLike[str] | None = None, accelerator: str | None = None, local_ranks: int | None = None
) -> Hardware:
    """Read the resources this process may use now.

    Args:
        data_path: where the dataset lives, to classify its storage (local NVMe, HDD, network).
        accelerator: ``"cuda"``, ``"mps"`` or ``"cpu"``; detected when ``None``.
        local_ranks: the training ranks on this node, where known (a Trainer's ``num_devices``); else
            ``LOCAL_WORLD_SIZE`` / ``SLURM_NTASKS_PER_NODE`` (:func:`local_world_size`).
    """
    cpus, source = usable_cpus()
    memory = psutil.virtual_memory()
    shm = shm_usage()
    gpus = probe_gpus()
    notes = []
    if source != "os.cpu_count()":
        notes.append(f"{source} limits this process to {cpus} of {os.cpu_count()} CPUs")
    return Hardware(
        logical_cpus=os.cpu_count() or 1,
        physical_cpus=psutil.cpu_count(logical=False),
        usable_cpus=cpus,
        usable_cpus_source=source,
        local_world_size=local_world_size(ranks=local_ranks),
        gpus=gpus,
        accelerator=accelerator or _detect_accelerator(gpus),
        ram_total_mb=memory.total / 2**20,
        ram_available_mb=memory.available / 2**20,
        shm_total_mb=None if shm is None else shm[0],
        shm_free_mb=None if shm is None else shm[1],
        start_method=default_start_method(),
        storage=None if data_path is None else probe_storage(data_path),
        notes=tuple(notes),
    )


def default_start_method() -> str:
    """The start method new worker processes get: the one set, else the platform's default."""
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()


def _detect_accelerator(gpus: tuple[GpuInfo, ...]) -> str:
    import torch

    if gpus or torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def pcie_capacity_of_device(hardware: Hardware | None, device: Any) -> float | None:
    """PCIe capacity (MB/s) of the GPU behind ``device``; ``None`` off CUDA or when unknown."""
    if hardware is None or device.type != "cuda" or not hardware.gpus:
        return None
    gpu = hardware.gpus[min(device.index or 0, len(hardware.gpus) - 1)]
    return pcie_capacity_mbps(gpu)
