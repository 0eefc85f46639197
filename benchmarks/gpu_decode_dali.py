"""DALI as the yardstick for benchmarks/gpu_decode.py (issue 38): the same files, crop, flip and normalise.

fn.readers.file, fn.decoders.image(device="mixed"), random_resized_crop, crop_mirror_normalize; DALI imported lazily.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def dali_pipeline(
    samples: list[tuple[str, int]],
    batch: int,
    size: int,
    threads: int = 4,
    device: str = "gpu",
    fused_crop: bool = False,
    seed: int = 0,
    prefetch: int = 2,
):
    """A built DALI pipeline yielding ``(images NHWC float16, labels int32)`` per batch.

    ``device="gpu"``: decode with ``device="mixed"`` and augment on the GPU (``"cpu"``: all on the host, for
    a CPU-only check of the code). ``fused_crop``: ``fn.decoders.image_random_crop`` (DALI's ResNet recipe,
    decodes only the crop's region of interest) instead of ``fn.decoders.image`` then ``fn.random_resized_crop``.
    """
    from nvidia.dali import fn, pipeline_def, types

    files, labels = [path for path, _ in samples], [label for _, label in samples]
    gpu = device == "gpu"

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None, seed=seed,
                  prefetch_queue_depth=prefetch)  # fmt: skip
    def pipe():
        jpegs, label = fn.readers.file(files=files, labels=labels, random_shuffle=True, name="Reader")
        decoder = "mixed" if gpu else "cpu"
        if fused_crop:
            images = fn.decoders.image_random_crop(
                jpegs, device=decoder, output_type=types.RGB, random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10,
            )  # fmt: skip
            images = fn.resize(images, resize_x=size, resize_y=size)
        else:
            images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
            images = fn.random_resized_crop(images, size=[size, size], random_area=[0.08, 1.0],
                                            random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)  # fmt: skip
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT16, output_layout="HWC", mean=MEAN, std=STD, mirror=fn.random.coin_flip()
        )
        return images, label

    built = pipe()
    built.build()
    return built


class DaliLoader:
    """``length`` batches ``(images [B, 3, S, S] bf16 channels-last, labels int64)`` from a DALI pipeline.

    The NHWC float16 output permuted to NCHW is channels-last already; the cast to bf16 keeps that layout
    (one elementwise kernel on the consumer's stream, as a DALI user feeding a bf16 model would write).
    """

    def __init__(self, pipeline, length: int) -> None:
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        self.length = length
        self._iterator = DALIGenericIterator(
            pipeline, ["images", "labels"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP,
            auto_reset=True,
        )  # fmt: skip

    def __len__(self) -> int:
        return self.length

    def _next(self) -> dict:
        try:
            return next(self._iterator)[0]
        except StopIteration:
            # the reader's epoch ended; auto_reset has rewound it
            return next(self._iterator)[0]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.length):
            out = self._next()
            images = out["images"].permute(0, 3, 1, 2).to(torch.bfloat16)
            yield images, out["labels"].view(-1).long()


def dali_alone(samples, batch: int, size: int, warmup: int, batches: int, cuda: bool, **options) -> dict:
    """images/s of DALI's pipeline with no model: a consumer that only takes the batches."""
    pipeline = dali_pipeline(samples, batch, size, device="gpu" if cuda else "cpu", **options)
    loader = iter(DaliLoader(pipeline, warmup + batches))
    for _ in range(warmup):
        next(loader)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    taken = sum(1 for _ in loader)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    del loader, pipeline
    return {"images_per_s": taken * batch / wall, "batches": taken}
