"""How a loader's workers hand their batches to the training process: ``torch.multiprocessing``'s sharing strategy.

``file_system`` spares the main thread a connection per tensor; its leftovers need removing (docs/loader.md).
"""

from __future__ import annotations

import contextlib
import multiprocessing.context
import os
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch.multiprocessing
from psutil import pid_exists

__all__ = [
    "FAST_HANDOVER",
    "ShareBy",
    "process_strategy",
    "reclaim_segments",
    "start_shm_manager",
    "with_strategy",
]

#: The strategy autotune tries against the default: a shared-memory file name per tensor, no connection.
FAST_HANDOVER = "file_system"


_MANAGER_CLIENT: list[torch.Tensor] = []  # a tiny file_system tensor that keeps this process's manager connected


def start_shm_manager() -> None:
    """Start PyTorch's ``torch_shm_manager`` for this process, once, before ``file_system`` workers are forked.

    A forked worker shares its parent's manager; without one each worker starts its own, and many workers take
    seconds longer to their first batch (``benchmarks/shm_manager_startup.py``). The manager exits once its
    processes are gone.
    """
    if _MANAGER_CLIENT:
        return
    # Only the manager is wanted: this process's own strategy is put back.
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(FAST_HANDOVER)
    try:
        _MANAGER_CLIENT.append(torch.zeros(1).share_memory_())
    finally:
        torch.multiprocessing.set_sharing_strategy(previous)


def process_strategy() -> str:
    """The strategy this process's workers use unless told otherwise (``file_descriptor`` on Linux)."""
    return str(torch.multiprocessing.get_sharing_strategy())


class ShareBy:
    """A picklable ``worker_init_fn``: the worker sends its batches with ``strategy``, then runs ``inner``.

    Args:
        strategy: one of ``torch.multiprocessing.get_all_sharing_strategies()``.
        inner: the loader's own ``worker_init_fn``, called afterwards with the worker id.

    Made in the training process, a ``file_system`` one starts that process's shared-memory manager
    (:func:`start_shm_manager`), so the workers forked later share it, and its workers note their pids (a
    line each in a temporary file, removed with this object), so that :meth:`reclaim` can remove what they
    sent and nobody received once the loader stopped early
    (:class:`~lightning_dataperf.datamodule.datamodule.TunedDataModule` calls it at teardown).

    Example::

        share = ShareBy("file_system", my_init)
        loader = DataLoader(dataset, batch_size=16, num_workers=42, worker_init_fn=share)
        ...                      # iterate, stop early
        del iterator             # the workers are stopped
        share.reclaim()          # their unreceived batches leave /dev/shm
    """

    def __init__(self, strategy: str, inner: Callable[[int], Any] | None = None) -> None:
        known = sorted(torch.multiprocessing.get_all_sharing_strategies())
        if strategy not in known:
            raise ValueError(f"ShareBy({strategy!r}): this platform's sharing strategies are {known}.")
        self.strategy, self.inner = strategy, inner
        self._pid_file: str | None = None  # each worker appends its pid (any start method; no lock to share)
        if strategy == FAST_HANDOVER:
            start_shm_manager()
            handle, self._pid_file = tempfile.mkstemp(prefix="lightning_dataperf_workers_", suffix=".pids")
            os.close(handle)
            weakref.finalize(self, _release, self._pid_file, os.getpid())  # its loaders are gone: reclaim, remove

    def __call__(self, worker_id: int) -> None:
        torch.multiprocessing.set_sharing_strategy(self.strategy)
        if self._pid_file is not None:
            parent = multiprocessing.parent_process()  # the process that started this worker, whatever the method
            line = f"{os.getpid()} {parent.pid if parent is not None else os.getppid()}\n"
            with contextlib.suppress(OSError):  # gone (its ShareBy was collected): nothing to note
                handle = os.open(self._pid_file, os.O_WRONLY | os.O_APPEND)  # one short append: atomic
                try:
                    os.write(handle, line.encode())
                finally:
                    os.close(handle)
        if self.inner is not None:
            self.inner(worker_id)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if multiprocessing.context.get_spawning_popen() is None:  # pickled, not for a worker: the pids stay here
            state["_pid_file"] = None
        return state

    def worker_pids(self) -> tuple[int, ...]:
        """The pids of the workers this process started with this ``worker_init_fn``, in order (a copy made
        before other processes started, a DDP rank's say, is shared: their workers are theirs, not listed)."""
        return () if self._pid_file is None else _noted_pids(self._pid_file, os.getpid())

    def reclaim(self) -> int:
        """Remove the ``file_system`` batches that the exited workers this process started with this
        ``worker_init_fn`` sent and no process received (:func:`reclaim_segments`); how many. Call it once the
        loader's iterator is stopped (after ``trainer.fit``)."""
        return reclaim_segments(self.worker_pids())

    def __repr__(self) -> str:
        return f"ShareBy({self.strategy!r}, inner={self.inner!r})"


def with_strategy(loader_kwargs: Mapping[str, Any], strategy: str | None) -> dict[str, Any]:
    """``loader_kwargs`` whose workers send with ``strategy`` (``None``: unchanged), their own init kept."""
    kwargs = dict(loader_kwargs)
    if strategy is not None:
        kwargs["worker_init_fn"] = ShareBy(strategy, kwargs.get("worker_init_fn"))
    return kwargs


def reclaim_segments(pids: Iterable[int], shm_dir: str = "/dev/shm") -> int:
    """Remove the ``file_system`` shared-memory files that the exited processes ``pids`` (a stopped loader's
    workers) made and no process of this user maps; how many (Linux; elsewhere nothing).

    A loader stopped before its end leaves the batches its workers had sent but the training process never
    received: sent by file name, each stays in ``/dev/shm`` until the process's ``torch_shm_manager`` exits
    with the process. A file some process maps (a batch received and still held, here or in another
    rank) is kept: removing its name makes PyTorch abort when the batch is freed ("could not unlink the
    shared memory file"); so are the files of a maker still alive. PyTorch names a segment
    ``torch_<pid of its maker>_...``, a pid as the maker's namespace numbers it: inside a container nothing is
    removed (another one sharing ``/dev/shm`` numbers its own workers alike, unseen), and on the host a file
    whose pid a container's process also has is kept.

    Example::

        reclaim_segments(shutdown_loader_iterator(iterator))
    """
    prefixes = tuple(f"torch_{pid}_" for pid in pids)
    if not prefixes or not sys.platform.startswith("linux") or _nested_pid_namespace():
        return 0
    try:
        names = [name for name in os.listdir(shm_dir) if name.startswith(prefixes)]
    except OSError:
        return 0
    makers = {name: _maker(name) for name in names}
    gone = {maker for maker in set(makers.values()) if not pid_exists(maker)}  # another user's counts as alive
    makers = {name: maker for name, maker in makers.items() if maker in gone}
    if not makers:
        return 0
    seen = _torch_files_in_use()
    if seen is None:  # cannot tell which files are still held: remove nothing
        return 0
    held, elsewhere = seen
    removed = 0
    for name, maker in makers.items():
        if name not in held and maker not in elsewhere:
            with contextlib.suppress(OSError):  # gone already, or not ours to remove
                os.unlink(os.path.join(shm_dir, name))
                removed += 1
    return removed


def _maker(name: str) -> int:
    """The pid in a PyTorch segment's name, ``torch_<pid>_<random>_<counter>``."""
    return int(name.split("_", 2)[1])


def _nested_pid_namespace() -> bool:
    """Whether this process runs in a pid namespace below the host's (a container): there, another namespace
    sharing ``/dev/shm`` (``docker --ipc=host``) numbers its workers from the same small pids and cannot be seen,
    so a file's name cannot say whose it is. Unknown (no ``NSpid`` line): ``True``."""
    try:
        return len(_nspid("self")) != 1
    except OSError:
        return True


def _nspid(pid: str) -> list[str]:
    """A process's pid in each pid namespace it is in, outermost first (``/proc/<pid>/status``'s ``NSpid``;
    empty without that line)."""
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
        return next((line.split()[1:] for line in status if line.startswith("NSpid:")), [])


def _torch_files_in_use() -> tuple[set[str], set[int]] | None:
    """The names of the ``torch_*`` files mapped by any process of this user (``/proc/<pid>/maps``), whatever the
    path they are mapped by (``/dev/shm`` may be a link), and the pids that processes in containers below this
    namespace have there (a file named after one may be theirs); ``None`` when this process's map is unreadable."""
    me, uid, names, inner = os.getpid(), os.getuid(), set(), set()
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                nspid = _nspid(entry.name)
                if len(nspid) > 1:  # in a container: its own numbering
                    inner.update(int(pid) for pid in nspid[1:] if pid.isdigit())
                if entry.stat().st_uid != uid:
                    continue
                with open(f"/proc/{entry.name}/maps", encoding="utf-8", errors="replace") as maps:
                    for line in maps:
                        fields = line.split(maxsplit=5)
                        if len(fields) == 6 and "torch_" in fields[5]:
                            names.add(fields[5].split()[0].rsplit("/", 1)[-1])
            except OSError:  # gone, or not readable
                if int(entry.name) == me:
                    return None
    return names, inner


def _noted_pids(path: str, parent: int) -> tuple[int, ...]:
    """The worker pids noted in a :class:`ShareBy`'s pid file whose parent is ``parent``, in order."""
    try:
        with open(path, encoding="ascii") as noted:
            pairs = [line.split() for line in noted]
    except (OSError, ValueError):
        return ()
    ours = (int(pair[0]) for pair in pairs if len(pair) == 2 and pair[0].isdigit() and pair[1] == str(parent))
    # A reused pid is noted twice; its files are reclaimed once.
    return tuple(dict.fromkeys(ours))


def _release(path: str, owner: int) -> None:
    """A :class:`ShareBy` collected (its loaders and their workers gone): what they left is reclaimed and its pid
    file removed, in the process that made it only (a forked worker's copy does nothing)."""
    if os.getpid() != owner:
        return
    with contextlib.suppress(Exception):  # a finalizer must not raise
        reclaim_segments(_noted_pids(path, owner))
    with contextlib.suppress(OSError):
        os.unlink(path)
