"""The LeNet5 benchmark's feeders alone (issue 17 part 4): images/s of one epoch each, no training.

Run it with a MindSpore virtualenv's Python (1.5.1 or 2.x; CPU is enough), from the repository root:

    <venv>/bin/python testbed/feeder_bench.py [--data data/mnist] [--batch-size 32] [--epochs 1]

It preprocesses MNIST's training set once (``lenet.preprocessed_arrays``, as the benchmark child does),
then times, one after the other, ``--epochs`` epoch(s) of each feeder over the same cached arrays:

  - ``per-image NumpySlicesDataset + batch``: the sink feeder before issue 17 part 4 (one Python call
    per image, shuffled by the dataset, one worker), kept here only as the baseline;
  - ``pre-batched GeneratorDataset (sink)``: ``lenet.batched_dataset``, the sink feeder now (one Python
    call per batch);
  - ``Tensors cut from cached arrays (direct loop)``: ``lenet.epoch_batches``, the non-sink feeder.

Prints one line per feeder (the fastest of its epochs: the first one is cold and a shared machine is
noisy) and writes them, every epoch's images/s included, as JSON to artifacts/feeder-bench.json
(--out). The benchmark child records one cold epoch of its feeder: a lower number than this one's. A
benchmark, not a test: nothing is asserted. ``--data`` is a prepared MNIST folder or the gzipped
files (prepared into a temporary folder, checksums from its SHA256SUMS).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "verify"))

from msgpu_verify import bench, mnist  # noqa: E402  (after the path above)


def prepared(data: Path) -> Path:
    if mnist.is_complete(data):
        return data
    sums = data / "SHA256SUMS"
    checksums = mnist.parse_sha256sums(sums.read_text()) if sums.is_file() else None
    return Path(mnist.prepare(str(data), str(Path(tempfile.gettempdir()) / "msgpu-feeder-bench-mnist"), checksums))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "mnist")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1, help="epochs timed per feeder (each on its own)")
    parser.add_argument("--random-seed", type=int, default=bench.RANDOM_SEED)
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "feeder-bench.json")
    args = parser.parse_args(argv)

    import mindspore as ms
    import numpy as np
    from msgpu_verify import lenet

    ms.context.set_context(mode=ms.context.GRAPH_MODE, device_target="CPU")
    ms.dataset.config.set_seed(args.random_seed)
    started = time.perf_counter()
    images, labels = lenet.preprocessed_arrays(str(prepared(args.data)), True)
    prepare_s = time.perf_counter() - started
    batch = args.batch_size

    def per_image():  # the old sink feeder, verbatim apart from its name
        ds = ms.dataset.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True)
        return ds.batch(batch, drop_remainder=True).create_tuple_iterator(output_numpy=True, num_epochs=1)

    def pre_batched():
        return lenet.batched_dataset(images, labels, batch, args.random_seed).create_tuple_iterator(
            output_numpy=True, num_epochs=1
        )

    rng = np.random.default_rng(args.random_seed)
    feeders = [
        ("per-image NumpySlicesDataset + batch (old sink feeder)", per_image),
        (bench.FEEDER_KINDS[True], pre_batched),
        (bench.FEEDER_KINDS[False], lambda: lenet.epoch_batches(images, labels, batch, rng)),
    ]
    results = []
    for kind, make in feeders:
        runs = [bench.measure_feeder(kind, make, batch) for _ in range(args.epochs)]
        best = max(runs, key=lambda run: run["images_per_s"] or 0.0)
        results.append(dict(best, epochs=[run["images_per_s"] for run in runs]))
        print(f"{kind}: {best['images_per_s']:,.0f} images/s ({best['batches']} batches in {best['seconds']} s)")
    document = {
        "mindspore_version": ms.__version__,
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "images": len(images),
        "batch_size": batch,
        "random_seed": args.random_seed,
        "prepare_s": round(prepare_s, 3),
        "feeders": results,
        "speedup_pre_batched_vs_per_image": round(results[1]["images_per_s"] / results[0]["images_per_s"], 1),
    }
    print(f"pre-batched vs per-image: {document['speedup_pre_batched_vs_per_image']}x (MindSpore {ms.__version__})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    sys.stdout.flush()
    os._exit(0)  # MindSpore's dataset threads can keep a finished interpreter waiting


if __name__ == "__main__":
    sys.exit(main())
