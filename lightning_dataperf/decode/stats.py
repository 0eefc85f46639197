"""The GPU-decode path's telemetry as a typed record: :class:`DecodeStats`, and its change over a window."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dataperf.tags import DECODE_GROUP

__all__ = ["GPU_BACKENDS", "DecodeStats"]

#: The decode libraries that decode on the GPU (``DecodeStats.backend``); ``"pil"`` is the CPU path.
GPU_BACKENDS = ("torchvision", "nvjpeg", "nvimgcodec")


@dataclass(frozen=True)
class DecodeStats:
    """Decode telemetry of a :class:`~lightning_dataperf.decode.GpuDecodeLoader` (cumulative, or a window).

    ``decode_seconds`` is the device time from the start of the decode to the end of the augment
    (CUDA events, read back lazily; host time on CPU), ``submit_seconds`` the wall time the decode
    thread spent submitting it (GIL waits included), ``submit_cpu_seconds`` that thread's own CPU
    time; ``prepare_seconds`` / ``prepare_cpu_seconds`` the wall and CPU time of the host-only half of each
    batch (:meth:`~lightning_dataperf.decode.JpegDecoder.prepare`, in a thread of its own under a
    ``GpuDecodeLoader``), ``barrier_seconds`` the decode thread's host waits before a decoder that writes at
    call time (nvJPEG's hardware engine through nvImageCodec), ``call_seconds`` the decode library's call where it
    runs in a thread of its own (:meth:`~lightning_dataperf.decode.JpegDecoder.submit`; else it is inside
    ``submit_seconds``); ``takes`` the batches the training step took,
    ``lookahead_mean`` the decoded batches already waiting when it asked for one, ``wait_seconds`` its total
    wait for them; ``backend`` the decode library; ``cpu_share`` the images of split batches decoded on the CPU
    (in ``images``, not in ``cpu_fallback``). ``since(earlier)`` gives a window (DataPerfCallback logs it).

    Example::

        before = loader.stats()
        ...                                   # some training steps
        window = loader.stats().since(before)
        window.to_metrics()                   # {"Decode/batch_seconds": 0.0061, "Decode/wait_seconds": 0.0004, ...}
        print(window.format())
    """

    batches: int = 0
    images: int = 0
    decode_seconds: float = 0.0
    submit_seconds: float = 0.0
    wait_seconds: float = 0.0
    lookahead_mean: float = 0.0
    cpu_fallback: int = 0
    undecodable: int = 0
    # NVML, the mean of the readings taken; None where not measured
    jpeg_util_percent: float | None = None
    submit_cpu_seconds: float = 0.0
    backend: str = ""
    takes: int = 0
    prepare_seconds: float = 0.0
    prepare_cpu_seconds: float = 0.0
    barrier_seconds: float = 0.0
    call_seconds: float = 0.0
    # split decode: images decoded on the CPU (the workers' share)
    cpu_share: int = 0

    def since(self, earlier: DecodeStats) -> DecodeStats:
        """What happened between ``earlier`` and this snapshot (the JPEG-engine reading is this one's: a window's
        owner replaces it with the mean of its readings, see ``StageTimer``)."""
        takes = self.takes - earlier.takes
        depth = self.lookahead_mean * self.takes - earlier.lookahead_mean * earlier.takes
        return DecodeStats(
            batches=self.batches - earlier.batches,
            images=self.images - earlier.images,
            decode_seconds=self.decode_seconds - earlier.decode_seconds,
            submit_seconds=self.submit_seconds - earlier.submit_seconds,
            wait_seconds=self.wait_seconds - earlier.wait_seconds,
            lookahead_mean=depth / takes if takes > 0 else 0.0,
            cpu_fallback=self.cpu_fallback - earlier.cpu_fallback,
            undecodable=self.undecodable - earlier.undecodable,
            jpeg_util_percent=self.jpeg_util_percent,
            submit_cpu_seconds=self.submit_cpu_seconds - earlier.submit_cpu_seconds,
            backend=self.backend,
            takes=takes,
            prepare_seconds=self.prepare_seconds - earlier.prepare_seconds,
            prepare_cpu_seconds=self.prepare_cpu_seconds - earlier.prepare_cpu_seconds,
            barrier_seconds=self.barrier_seconds - earlier.barrier_seconds,
            call_seconds=self.call_seconds - earlier.call_seconds,
            cpu_share=self.cpu_share - earlier.cpu_share,
        )

    def per_batch(self, total: float) -> float:
        return total / self.batches if self.batches else 0.0

    @property
    def wait_per_take(self) -> float:
        return self.wait_seconds / self.takes if self.takes else 0.0

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        """``{"Decode/...": float}`` for a logger's ``log_metrics`` (per batch where a time)."""
        metrics = {
            "batch_seconds": self.per_batch(self.decode_seconds),
            "images_per_sec": self.images / self.decode_seconds if self.decode_seconds else 0.0,
            "submit_seconds": self.per_batch(self.submit_seconds),
            "submit_cpu_seconds": self.per_batch(self.submit_cpu_seconds),
            "wait_seconds": self.wait_per_take,
            "lookahead_mean": self.lookahead_mean,
            "cpu_fallback": float(self.cpu_fallback),
            "undecodable": float(self.undecodable),
            "images": float(self.images),
            "prepare_seconds": self.per_batch(self.prepare_seconds),
            "barrier_seconds": self.per_batch(self.barrier_seconds),
            "call_seconds": self.per_batch(self.call_seconds),
        }
        if self.jpeg_util_percent is not None:
            metrics["jpeg_util_percent"] = self.jpeg_util_percent
        return {prefix + DECODE_GROUP + key: value for key, value in metrics.items()}

    def format(self) -> str:
        engine = "" if self.jpeg_util_percent is None else f", JPEG engine {self.jpeg_util_percent:.0f}% busy"
        # PIL is the path without CUDA; a custom backend's place is not recorded, so none is claimed for it
        where = " on the CPU" if self.backend == "pil" else " on the GPU" if self.backend in GPU_BACKENDS else ""
        split = f", {self.cpu_share} of {self.images} images by the CPU workers" if self.cpu_share else ""
        return (
            f"decode path ({self.backend or 'backend unknown'}): {self.batches} batches{split}, per batch "
            f"{1e3 * self.per_batch(self.decode_seconds):.2f} ms{where} from decode to augment, decode thread "
            f"{1e3 * self.per_batch(self.submit_seconds):.2f} ms ({1e3 * self.per_batch(self.submit_cpu_seconds):.2f}"
            f" ms CPU; host barrier {1e3 * self.per_batch(self.barrier_seconds):.2f} ms), preparing "
            f"{1e3 * self.per_batch(self.prepare_seconds):.2f} ms; the step waited {1e3 * self.wait_per_take:.2f} ms "
            "per batch with "
            f"{self.lookahead_mean:.1f} decoded batches ready{engine}; CPU fallback {self.cpu_fallback}"
        )
