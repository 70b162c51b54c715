"""The seed's LeNet5, its MNIST preprocessing and the two feeders, for the benchmark child. Imports MindSpore
and numpy.

Only ``bench`` imports this module, inside the training child process (and testbed/feeder_bench.py).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import mindspore as ms
import mindspore.dataset.transforms.c_transforms as C
import mindspore.dataset.vision.c_transforms as CV
import numpy as np
from mindspore import nn

from .batches import ShuffledBatches

RESIZE = (32, 32)
RESCALE = 1 / (255 * 0.3081)
SHIFT = -0.1307 / 0.3081


class LeNet5(nn.Cell):
    """Exactly the seed's network (verify/seed/main.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, stride=1, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, stride=1, pad_mode="valid")
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(400, 120)
        self.fc2 = nn.Dense(120, 84)
        self.fc3 = nn.Dense(84, 10)

    def construct(self, x):
        x = self.relu(self.conv1(x))
        x = self.pool(x)
        x = self.relu(self.conv2(x))
        x = self.pool(x)
        x = self.flatten(x)
        x = self.fc1(x)
        x = self.fc2(x)
        x = self.fc3(x)
        return x


def preprocessed_arrays(data_dir: str, training: bool, limit: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The seed's decode + Resize + Rescale + HWC2CHW + TypeCast, run ONCE with MindSpore's own operators.

    Returns float32 images (N, 1, 32, 32) and int32 labels (N,), in file order.
    """
    folder = os.path.join(data_dir, "train" if training else "test")
    kwargs = {"shuffle": False}
    if limit:
        kwargs["num_samples"] = limit
    workers = max(1, min(8, os.cpu_count() or 1))
    ds = ms.dataset.MnistDataset(folder, **kwargs)
    ds = ds.map(
        input_columns=["image"],
        operations=[CV.Resize(RESIZE), CV.Rescale(RESCALE, SHIFT), CV.HWC2CHW()],
        num_parallel_workers=workers,
    )
    ds = ds.map(input_columns=["label"], operations=C.TypeCast(ms.int32))
    ds = ds.batch(1000, drop_remainder=False)
    images = []
    labels = []
    for row in ds.create_dict_iterator(output_numpy=True, num_epochs=1):
        images.append(row["image"])
        labels.append(row["label"])
    return np.ascontiguousarray(np.concatenate(images)), np.ascontiguousarray(np.concatenate(labels))


def batched_dataset(images: np.ndarray, labels: np.ndarray, batch_size: int, random_seed: int):
    """The sink path's feeder: a GeneratorDataset whose every row is a whole batch.

    Its source (``batches.ShuffledBatches``) draws a fresh permutation from a numpy Generator seeded with
    ``random_seed`` each epoch and yields contiguous (batch, 1, 32, 32) float32 images and (batch,) int32
    labels, full batches only: one Python call per batch (1,875 per MNIST epoch of 32) instead of one per
    image (60,000) as a NumpySlicesDataset + batch does. Same samples per epoch as the seed, reshuffled
    every epoch, the same batches for a fixed seed (and the same ones ``epoch_batches`` cuts).
    """
    source = ShuffledBatches(images, labels, batch_size, np.random.default_rng(random_seed))
    return ms.dataset.GeneratorDataset(source, column_names=["image", "label"], shuffle=False)


def build_parts(lr: float, momentum: float):
    """The seed's network, loss and optimiser (SoftmaxCrossEntropyWithLogits, Momentum)."""
    net = LeNet5()
    loss = nn.loss.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), lr, momentum)
    return net, loss, opt


def train_step_cell(net, loss, opt):
    """What Model.train runs per step (TrainOneStepCell over WithLossCell), without the dataset machinery."""
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    step.set_train()
    return step


def epoch_batches(images: np.ndarray, labels: np.ndarray, batch_size: int, rng: np.random.Generator):
    """The direct loop's feeder, one epoch: Tensors of the batches ``ShuffledBatches`` cuts from a fresh
    permutation drawn from ``rng`` (full batches only, like the seed)."""
    return [(ms.Tensor(x), ms.Tensor(y)) for x, y in ShuffledBatches(images, labels, batch_size, rng)]


def accuracy(net, images: np.ndarray, labels: np.ndarray, batch_size: int = 1000) -> float:
    """Top-1 accuracy of ``net`` over all of ``images``."""
    net.set_train(False)
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = net(ms.Tensor(images[start : start + batch_size])).asnumpy()
        correct += int((logits.argmax(axis=1) == labels[start : start + batch_size]).sum())
    net.set_train(True)
    return correct / float(len(images))
