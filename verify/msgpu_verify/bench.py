"""LeNet5 benchmark: the seed's model and hyperparameters, trained and measured in a child process.

The parent (``run_bench``) is standard library only; the training child (``python -m msgpu_verify.bench
--child CONFIG``) and the seed child (``--seed-child CONFIG``) import MindSpore. Both children print
one result line (marker + JSON) and leave with ``os._exit(0)``.

Why ours is faster than the seed, honestly: the same network, loss, optimiser, learning rate, batch
size and samples per epoch (every image once, freshly shuffled, full batches only), but the seed's
decode + resize + rescale (MindSpore's own operators) runs once before training instead of every epoch,
and both of our feeders hand over whole batches cut from the cached arrays (``batches.ShuffledBatches``; the
same batches for a fixed --random-seed). Without sink mode (on CPU: MindSpore 1.5.1 has no sink mode
there) each epoch feeds Tensors cut from the cached arrays straight into TrainOneStepCell (what
Model.train runs per step) instead of a dataset pipeline that competes with training for the CPU
cores. With sink mode (the default on GPU), Model.train sinks a GeneratorDataset whose every row is a
whole batch: one Python call per batch (1,875 per MNIST epoch of 32) instead of one per image (60,000)
as a NumpySlicesDataset + batch would make, so the Python feeder is not what a fast GPU waits for.

Which one bound the run: before training (outside its time) the child runs one epoch through the very
feeder the training uses, alone, and records it as ``feeder`` (kind, images/s, seconds, batches);
``bound_by`` is "feeder" when that is below FEEDER_HEADROOM times the training's headline images/s,
else "training".
"""

from __future__ import annotations

import json
import os
import runpy
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from . import mnist
from ._proc import RESULT_MARKER, find_result, run_child
from .limits import SEED_TIMEOUT_FACTOR, bench_timeout_s

# The benchmark's knobs, the defaults of `python -m msgpu_verify bench` (its argparse reads them; the verify role
# passes its own verify_bench_epochs and verify_bench_timeout explicitly, and a test keeps the role's default epochs
# equal to these). The seed's hyperparameters: 3 epochs of batch 32, Momentum(lr 0.01, 0.9).
DEFAULT_EPOCHS = 3
BATCH_SIZE = 32
LR = 0.01
MOMENTUM = 0.9
# --quick trains at most QUICK_EPOCHS epochs, of every one of the 60,000 training images (1,875 steps of 32), and
# tests on all 10,000 test images: nothing is sliced.
QUICK_EPOCHS = 2
QUICK_NOTE = (
    f"quick run: at most {QUICK_EPOCHS} epochs instead of {DEFAULT_EPOCHS}, each of all 60000 training images, and "
    "all 10000 test images. The seed's LeNet5 (default initialisation, lr 0.01) stays near loss 2.30 for its first "
    "~2000 steps, so fewer samples would prove nothing; two epochs learn MNIST (about 0.95-0.97 accuracy)."
)
SEED_SCRIPT = Path(__file__).resolve().parent.parent / "seed" / "main.py"
# One fixed random seed (weights, shuffles): every host and every run trains the same model on the
# same batches, so their numbers compare, and a short run never depends on the luck of the draw
# (unseeded, the seed's LeNet5 sometimes stays on its ~2.30 loss plateau for a whole quick run:
# 0.53 accuracy once in CI). --random-seed changes it.
RANDOM_SEED = 1


# "feeder" bounds a run whose feeder, alone, delivers less than twice the training's images/s. Without
# sink mode the feeder runs inside every epoch, one after the other with the steps, so its share of
# the epoch is training/feeder: at 2x it already takes half of it. With sink mode it runs beside the
# training, on the CPU cores the framework's host threads also need, so its rate measured alone is an
# upper bound: with less than 2x headroom it is the likeliest limit, with more it is not the limit.
FEEDER_HEADROOM = 2.0
FEEDER_KINDS = {
    True: "pre-batched GeneratorDataset (sink)",
    False: "Tensors cut from cached arrays (direct loop)",
}


def measure_feeder(kind: str, make_batches: Callable[[], Iterable[Any]], batch_size: int) -> Dict[str, Any]:
    """One epoch through a feeder alone: ``make_batches()`` (building it counts too: the direct loop cuts
    its Tensors there) and every batch drawn from it, timed."""
    start = time.perf_counter()
    batches = 0
    for _ in make_batches():
        batches += 1
    seconds = time.perf_counter() - start
    return {
        "kind": kind,
        "images_per_s": round(batches * batch_size / seconds, 1) if batches and seconds > 0 else None,
        "seconds": round(seconds, 3),
        "batches": batches,
    }


def bound_by(
    feeder_images_per_s: Optional[float], training_images_per_s: Optional[float], headroom: float = FEEDER_HEADROOM
) -> Optional[str]:
    """Which one bounds the run: "feeder" when the feeder alone is below ``headroom`` x the training's
    images/s, else "training"; None when either number is missing."""
    if not feeder_images_per_s or not training_images_per_s:
        return None
    return "feeder" if feeder_images_per_s < headroom * training_images_per_s else "training"


def percentile(values: List[float], fraction: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def headline(epochs: List[Dict[str, Any]]) -> Optional[float]:
    """Median images/s of epochs >= 2 (epoch 1 carries graph compilation); epoch 1 if it is the only one."""
    later = [e["images_per_s"] for e in epochs if e["epoch"] >= 2 and e.get("images_per_s")]
    if later:
        return round(statistics.median(later), 1)
    return epochs[0]["images_per_s"] if epochs else None


def sink_chunk(steps: int, target: int = 125) -> int:
    """Steps per sink chunk: the largest divisor of ``steps`` <= target (whole epoch if that is tiny)."""
    best = max(d for d in range(1, min(steps, target) + 1) if steps % d == 0)
    return best if best >= 25 or best == steps else steps


def effective_sink(requested: str, device: str) -> Tuple[bool, str]:
    """Sink mode actually used. Model.train falls back to non-sink on CPU (with a warning; measured on 1.5.1)."""
    if device.upper() == "CPU":
        note = "no dataset sink mode on CPU (Model.train falls back to non-sink there)"
        return False, note + ("; --sink on ignored" if requested == "on" else "")
    if requested == "off":
        return False, "sink mode off as requested"
    return True, f"dataset sink mode on {device}"


def emit(result: Dict[str, Any]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, (RESULT_MARKER + " " + json.dumps(result) + "\n").encode("utf-8"))
    os._exit(0)


def _epoch_timer_class():
    from mindspore.train.callback import Callback

    class EpochTimer(Callback):
        """Wall time per real epoch from callback timestamps; loss every ``log_every`` steps.

        Steps come from cb_params.cur_step_num: in sink mode MindSpore calls step_end once per sink
        chunk (cur_step_num grows by the chunk), otherwise once per step.
        """

        def __init__(self, steps_per_epoch: int, batch_size: int, log_every: int) -> None:
            super().__init__()
            self.steps_per_epoch = steps_per_epoch
            self.batch_size = batch_size
            self.log_every = log_every
            self.step = 0
            self.epoch_start = time.perf_counter()
            self.last = self.epoch_start
            self.step_times: List[float] = []
            self.loss_curve: List[List[float]] = []
            self.epochs: List[Dict[str, Any]] = []
            self.first_loss: Optional[float] = None

        @staticmethod
        def _loss(cb_params) -> float:
            out = cb_params.net_outputs
            if isinstance(out, (tuple, list)):
                out = out[0]
            return float(out.asnumpy()) if hasattr(out, "asnumpy") else float(out)

        def begin(self, run_context) -> None:
            self.epoch_start = time.perf_counter()
            self.last = self.epoch_start

        def step_end(self, run_context) -> None:
            now = time.perf_counter()
            cb_params = run_context.original_args()
            done = int(cb_params.cur_step_num) - self.step
            if done <= 0:
                return
            self.step += done
            self.step_times.append((now - self.last) / done * 1000.0)
            self.last = now
            epoch_end = self.step % self.steps_per_epoch == 0
            if done > 1 or self.step % self.log_every == 0 or epoch_end or self.first_loss is None:
                loss = self._loss(cb_params)
                self.loss_curve.append([self.step, round(loss, 5)])
                if self.first_loss is None:
                    self.first_loss = loss
            if epoch_end:
                seconds = now - self.epoch_start
                self.epochs.append(
                    {
                        "epoch": len(self.epochs) + 1,
                        "seconds": round(seconds, 3),
                        "images_per_s": round(self.steps_per_epoch * self.batch_size / seconds, 1),
                        "loss_first": None if self.first_loss is None else round(self.first_loss, 5),
                        "loss_last": self.loss_curve[-1][1] if self.loss_curve else None,
                    }
                )
                self.epoch_start = now
                self.first_loss = None

    return EpochTimer


class LoopTimer:
    """The EpochTimer's results for the direct loop: epochs, per-step times, loss curve."""

    def __init__(self) -> None:
        self.epochs: List[Dict[str, Any]] = []
        self.step_times: List[float] = []
        self.loss_curve: List[List[float]] = []


def direct_loop(
    lenet: Any,
    parts: Tuple[Any, Any, Any],
    images: Any,
    labels: Any,
    batch: int,
    epochs: int,
    log_every: int,
    random_seed: int = RANDOM_SEED,
) -> LoopTimer:
    """Non-sink training without the dataset machinery: per epoch a fresh shuffle of the cached arrays,
    cut into Tensors (inside the epoch's time), then TrainOneStepCell per batch, as Model.train does."""
    import numpy as np

    step_cell = lenet.train_step_cell(*parts)
    rng = np.random.default_rng(random_seed)
    timer = LoopTimer()
    done = 0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        batches = lenet.epoch_batches(images, labels, batch, rng)
        last = time.perf_counter()
        first_loss: Optional[float] = None
        loss_value: Optional[float] = None
        for index, (x, y) in enumerate(batches):
            out = step_cell(x, y)
            now = time.perf_counter()
            timer.step_times.append((now - last) * 1000.0)
            last = now
            done += 1
            if done % log_every == 0 or index == 0 or index == len(batches) - 1:
                loss_value = float(out.asnumpy())
                timer.loss_curve.append([done, round(loss_value, 5)])
                if first_loss is None:
                    first_loss = loss_value
        seconds = time.perf_counter() - start
        timer.epochs.append(
            {
                "epoch": epoch,
                "seconds": round(seconds, 3),
                "images_per_s": round(len(batches) * batch / seconds, 1),
                "loss_first": None if first_loss is None else round(first_loss, 5),
                "loss_last": None if loss_value is None else round(loss_value, 5),
            }
        )
    return timer


def train_child(config: Dict[str, Any]) -> Dict[str, Any]:
    """Our harness: cached preprocessed arrays, whole-batch feeders, sink mode on GPU, no per-step printing."""
    import mindspore as ms
    import numpy as np

    from . import lenet

    started = time.perf_counter()
    device = config["device"]
    ms.context.set_context(mode=ms.context.GRAPH_MODE, device_target=device)
    random_seed = int(config.get("random_seed", RANDOM_SEED))
    ms.common.set_seed(random_seed)  # initial weights (and numpy's global generator)
    ms.dataset.config.set_seed(random_seed)  # any random dataset operator (shuffles come from ShuffledBatches)
    quick = bool(config["quick"])
    train_x, train_y = lenet.preprocessed_arrays(config["data"], True)  # all of them, --quick too (QUICK_NOTE)
    test_x, test_y = lenet.preprocessed_arrays(config["data"], False)
    prepare_s = time.perf_counter() - started
    batch = int(config["batch_size"])
    steps = len(train_x) // batch
    sink, sink_note = effective_sink(config["sink"], device)
    chunk = sink_chunk(steps) if sink else 1
    net, loss, opt = lenet.build_parts(float(config["lr"]), float(config["momentum"]))
    epochs = int(config["epochs"])
    log_every = max(1, min(100, steps // 10))
    # The training's own feeder, one epoch alone, with its own objects (training's shuffles stay untouched).
    if sink:
        feeder = measure_feeder(
            FEEDER_KINDS[True],
            lambda: lenet.batched_dataset(train_x, train_y, batch, random_seed).create_tuple_iterator(
                output_numpy=True, num_epochs=1
            ),
            batch,
        )
    else:
        feeder = measure_feeder(
            FEEDER_KINDS[False],
            lambda: lenet.epoch_batches(train_x, train_y, batch, np.random.default_rng(random_seed)),
            batch,
        )
    train_start = time.perf_counter()
    if sink:
        timer = _epoch_timer_class()(steps, batch, log_every)
        model = ms.train.Model(net, loss, opt)
        train_ds = lenet.batched_dataset(train_x, train_y, batch, random_seed)
        model.train(epochs * (steps // chunk), train_ds, callbacks=[timer], dataset_sink_mode=True, sink_size=chunk)
    else:
        timer = direct_loop(lenet, (net, loss, opt), train_x, train_y, batch, epochs, log_every, random_seed)
    train_s = time.perf_counter() - train_start
    eval_start = time.perf_counter()
    accuracy = lenet.accuracy(net, test_x, test_y)
    eval_s = time.perf_counter() - eval_start
    checkpoint = config.get("checkpoint")
    if checkpoint:  # the trained weights, for `serving` (exported to MindIR there)
        Path(checkpoint).parent.mkdir(parents=True, exist_ok=True)
        ms.save_checkpoint(net, checkpoint)
    steady = timer.step_times[1:] if len(timer.step_times) > 1 else timer.step_times
    images_per_s = headline(timer.epochs)
    return {
        "device": device,
        "mode": "GRAPH",
        "sink": sink,
        "sink_requested": config["sink"],
        "sink_note": sink_note,
        "sink_size": chunk if sink else None,
        "step_time_source": f"sink chunks of {chunk} steps (per-step times are hidden in sink mode)"
        if sink
        else "per step (direct TrainOneStepCell loop over cached batches)",
        "quick": quick,
        "quick_note": QUICK_NOTE if quick else None,
        "epochs": timer.epochs,
        "images_per_s": images_per_s,
        "feeder": feeder,
        "bound_by": bound_by(feeder["images_per_s"], images_per_s),
        "step_time_ms": {
            "p50": None if not steady else round(percentile(steady, 0.5), 3),
            "p95": None if not steady else round(percentile(steady, 0.95), 3),
        },
        "loss_curve": timer.loss_curve,
        "accuracy": round(accuracy, 5),
        "samples_train": steps * batch,
        "samples_test": len(test_x),
        "batch_size": batch,
        "lr": float(config["lr"]),
        "momentum": float(config["momentum"]),
        "random_seed": random_seed,
        "mindspore_version": ms.__version__,
        "hostname": socket.gethostname(),
        "prepare_s": round(prepare_s, 3),
        "train_s": round(train_s, 3),
        "eval_s": round(eval_s, 3),
        "checkpoint": checkpoint or None,
    }


def seed_child(config: Dict[str, Any]) -> Dict[str, Any]:
    """Run verify/seed/main.py unchanged; wrap Model.train to add a timing callback, Model.eval to keep metrics.

    In --quick too it reads every image, as our quick run does (its epochs are the seed's own).
    """
    from mindspore.train import Model

    timers: List[Any] = []
    metrics: Dict[str, Any] = {}
    original_train = Model.train
    original_eval = Model.eval
    batch = int(config["batch_size"])

    def timed_train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=True, sink_size=-1):
        timer = _epoch_timer_class()(train_dataset.get_dataset_size(), batch, log_every=100)
        timers.append(timer)
        callbacks = [*list(callbacks or []), timer]
        return original_train(self, epoch, train_dataset, callbacks, dataset_sink_mode, sink_size)

    def kept_eval(self, *args, **kwargs):
        result = original_eval(self, *args, **kwargs)
        metrics.update(result)
        return result

    Model.train = timed_train
    Model.eval = kept_eval
    out_dir = tempfile.mkdtemp(prefix="msgpu-seed-")
    script = config.get("seed_script") or str(SEED_SCRIPT)
    started = time.perf_counter()
    sys.argv = [script, "--data_url=" + config["data"], "--train_url=" + out_dir, "--device_target", config["device"]]
    runpy.run_path(script, run_name="__main__")
    timer = timers[0] if timers else None
    epochs = timer.epochs if timer else []
    return {
        "script": script,
        "epochs": epochs,
        "images_per_s": headline(epochs),
        "accuracy": round(float(metrics["acc"]), 5) if "acc" in metrics else None,
        "elapsed_s": round(time.perf_counter() - started, 3),
    }


def _child_main(kind: str, config_text: str) -> None:
    config = json.loads(config_text)
    try:
        result = train_child(config) if kind == "--child" else seed_child(config)
    except BaseException as exc:
        import traceback

        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    emit(result)


def _run(kind: str, config: Dict[str, Any], timeout_s: float, python: str) -> Dict[str, Any]:
    package_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = package_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    child = run_child([python, "-m", "msgpu_verify.bench", kind, json.dumps(config)], timeout_s, env=env, cwd="/")
    raw = find_result(child.output)
    if raw is None:
        reason = f"timed out after {timeout_s} s" if child.timed_out else f"exited with {child.returncode}"
        tail = child.output[-4000:]
        return {"error": "the training child " + reason, "output_tail": tail, "elapsed_s": child.elapsed_s}
    result = json.loads(raw)
    result["elapsed_s"] = child.elapsed_s
    if "error" in result:
        result["output_tail"] = child.output[-4000:]
    return result


def run_bench(
    device: str = "CPU",
    data: str = "",
    epochs: int = DEFAULT_EPOCHS,
    batch_size: int = BATCH_SIZE,
    lr: float = LR,
    momentum: float = MOMENTUM,
    sink: str = "auto",
    quick: bool = False,
    compare_seed: bool = False,
    timeout_s: Optional[float] = None,
    python: Optional[str] = None,
    seed_script: Optional[str] = None,
    random_seed: int = RANDOM_SEED,
    checkpoint: Optional[str] = None,
) -> Dict[str, Any]:
    started = time.monotonic()
    python = python or sys.executable
    work = Path(tempfile.gettempdir()) / "msgpu-verify-mnist"
    prepared = data if mnist.is_complete(Path(data)) else str(mnist.prepare(data, str(work)))
    if quick:
        epochs = min(epochs, QUICK_EPOCHS)
    timeout = bench_timeout_s(timeout_s, quick)
    config = {
        "device": device,
        "data": prepared,
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "momentum": momentum,
        "sink": sink,
        "quick": quick,
        "seed_script": seed_script,
        "random_seed": random_seed,
        "checkpoint": str(Path(checkpoint).resolve()) if checkpoint else None,
    }
    result = _run("--child", config, timeout, python)
    result.setdefault("device", device)
    result.setdefault("quick", quick)
    result.setdefault("hostname", socket.gethostname())
    result["seed"] = None
    result["ratio"] = None
    if compare_seed:
        seed = _run("--seed-child", config, timeout * SEED_TIMEOUT_FACTOR, python)
        result["seed"] = seed
        if result.get("images_per_s") and seed.get("images_per_s"):
            result["ratio"] = round(result["images_per_s"] / seed["images_per_s"], 3)
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    result["timeout_s"] = timeout
    return result


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
