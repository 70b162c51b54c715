"""The benchmark's batches: whole batches cut from cached arrays, freshly shuffled every epoch, the source of both
of LeNet5's feeders (``lenet.batched_dataset``, ``lenet.epoch_batches``).

Standard library only (the arrays' own indexing does the work), so that it is tested without numpy or MindSpore;
``lenet`` imports it in the training child.
"""

from __future__ import annotations

from typing import Any, Iterator, Tuple


class ShuffledBatches:
    """Whole batches from cached arrays, freshly shuffled at every ``iter()`` (one epoch each).

    Each epoch draws one permutation from ``rng`` (a numpy Generator; anything with ``permutation(n)``)
    and yields ``(images[index], labels[index])`` for its first ``len(self)`` full slices of
    ``batch_size`` (the remainder is dropped, like the seed's drop_remainder). With numpy arrays the
    index arrays give contiguous copies. The source of ``lenet.batched_dataset`` (sink mode: one
    GeneratorDataset row per batch) and of ``lenet.epoch_batches`` (the direct loop).
    """

    def __init__(self, images: Any, labels: Any, batch_size: int, rng: Any) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size {batch_size}: must be at least 1")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.batch_size = batch_size
        self.rng = rng

    def __len__(self) -> int:
        return len(self.images) // self.batch_size

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        order = self.rng.permutation(len(self.images))
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            index = order[start : start + self.batch_size]
            yield self.images[index], self.labels[index]
