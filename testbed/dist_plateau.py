"""The data-parallel check's learning rule, measured: CPU runs of the worker's training with 1-8 ranks.

`python -m msgpu_verify distributed` judges whether the all-reduced training learned by every rank's accuracy on
its shard of the MNIST test set (distributed.MIN_HELDOUT_ACCURACY), because the seed's LeNet5 sits on a ~2.30 loss
plateau for thousands of steps. Where the plateau ends, and what accuracy looks like on it and after it, is measured
here with the worker's own code on the CPU, in ONE process per run (no mpirun, no NCCL, no GPU):
distributed.shard_arrays (train and test shards), set_seed(seed) before lenet.build_parts, lenet.train_step_cell,
rank r's batches from numpy.random.default_rng(seed + r) permuting its own shard (lenet.epoch_batches' rule) and
lenet.accuracy. NCCL's all-reduce with gradients_mean=True averages the N ranks' gradients of their batches' mean
losses; with equal batches that is the gradient of the mean loss over the N batches together, so one step here on
the N ranks' batches concatenated (32*N images) is the data-parallel step.

It needs MindSpore, which the controller does not have: a Python 3.8 virtualenv with the mindspore 2.0.0 wheel
(CPU + GPU; its LeNet5 initialisation is 1.5.1's: Dense and Conv2d weight_init='normal'), e.g.

    ~/.pyenv/versions/3.8.18/bin/python -m venv .cache/run_check/venv-ms2.0
    .cache/run_check/venv-ms2.0/bin/pip install mindspore==2.0.0 'numpy<1.24' 'pillow<10'
    PYTHONPATH=verify .cache/run_check/venv-ms2.0/bin/python -m testbed.dist_plateau run MNIST_DIR 2 1 >> runs.jsonl
    python -m testbed.dist_plateau collect runs.jsonl   # -> tests/unit/data/dist_plateau.json

`run` trains up to --steps (6000) and measures every rank's held-out accuracy every 250 steps, stopping once every
rank is above 0.95 (well past the plateau). Standard library + what the worker imports; MindSpore only in `run`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
DATA_FILE = ROOT / "tests" / "unit" / "data" / "dist_plateau.json"
EVERY = 250
DONE = 0.95


def run(data: str, size: int, seed: int, steps: int, batch: int = 32) -> Dict[str, Any]:
    import numpy as np
    from mindspore import Tensor, context
    from mindspore.common import set_seed
    from msgpu_verify import distributed, lenet

    context.set_context(mode=context.GRAPH_MODE, device_target="CPU")
    set_seed(seed)
    shards = [distributed.shard_arrays(data, size, rank) for rank in range(size)]
    tests = [distributed.shard_arrays(data, size, rank, "test") for rank in range(size)]
    net, loss, opt = lenet.build_parts(0.01, 0.9)
    step_cell = lenet.train_step_cell(net, loss, opt)
    rngs = [np.random.default_rng(seed + rank) for rank in range(size)]

    def epoch() -> List[Any]:
        orders = [rng.permutation(len(images)) for (images, _), rng in zip(shards, rngs)]
        count = len(shards[0][0]) // batch
        batches = []
        for i in range(count):
            cut = slice(i * batch, (i + 1) * batch)
            xs = np.concatenate([images[order[cut]] for (images, _), order in zip(shards, orders)])
            ys = np.concatenate([labels[order[cut]] for (_, labels), order in zip(shards, orders)])
            batches.append((Tensor(xs), Tensor(ys)))
        return batches

    started = time.perf_counter()
    losses: List[float] = []
    by_step: Dict[str, Any] = {}
    stream: List[Any] = []
    for step in range(1, steps + 1):
        if not stream:
            stream = epoch()
        x, y = stream.pop(0)
        losses.append(float(step_cell(x, y).asnumpy()))
        if step % EVERY == 0:
            accuracy = [round(lenet.accuracy(net, images, labels), 4) for images, labels in tests]
            by_step[str(step)] = {"accuracy": accuracy, "loss50": round(float(np.mean(losses[-50:])), 4)}
            if min(accuracy) > DONE:
                break
    return {
        "ranks": size,
        "seed": seed,
        "batch_per_rank": batch,
        "seconds": round(time.perf_counter() - started, 1),
        "loss_first50": round(float(np.mean(losses[:50])), 4),
        "by_step": by_step,
    }


def summary(record: Dict[str, Any], threshold: float = 0.5) -> Dict[str, Any]:
    """The last step on the plateau (every rank below ``threshold``) and the first one off it."""
    marks = sorted(record["by_step"].items(), key=lambda item: int(item[0]))
    below = [int(step) for step, mark in marks if max(mark["accuracy"]) < threshold]
    above = [int(step) for step, mark in marks if min(mark["accuracy"]) >= threshold]
    return {"last_on_plateau": max(below, default=None), "first_off": min(above, default=None)}


def collect(lines: List[str], mindspore: str) -> Dict[str, Any]:
    runs = [json.loads(line) for line in lines if line.startswith("{")]
    runs.sort(key=lambda r: (r["ranks"], r["seed"]))
    return {
        "generated_by": "python -m testbed.dist_plateau",
        "mindspore": mindspore,
        "device": "CPU",
        "lr": 0.01,
        "momentum": 0.9,
        "every": EVERY,
        "runs": runs,
    }


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="one CPU run (needs MindSpore); prints one JSON line")
    one.add_argument("data")
    one.add_argument("ranks", type=int)
    one.add_argument("seed", type=int)
    one.add_argument("--steps", type=int, default=6000)
    many = sub.add_parser("collect", help="JSON lines of `run` -> tests/unit/data/dist_plateau.json")
    many.add_argument("jsonl", type=Path)
    many.add_argument("--mindspore", default="2.0.0")
    args = parser.parse_args(argv)
    if args.command == "run":
        print(json.dumps(run(args.data, args.ranks, args.seed, args.steps)), flush=True)
        return 0
    document = collect(args.jsonl.read_text().splitlines(), args.mindspore)
    DATA_FILE.parent.mkdir(parents=True, exist_ok=True)
    DATA_FILE.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {DATA_FILE.relative_to(ROOT)}: {len(document['runs'])} runs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
