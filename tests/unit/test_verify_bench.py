"""The benchmark's feeders (issue 17 part 4): whole batches, reshuffled per epoch, timed alone, and which bound a run.

Training needs MindSpore (tests/system trains for real on the sandbox host); these are the pure parts of bench.py
and batches.py, with stand-ins for numpy's arrays and Generator (the controller has neither numpy nor MindSpore).
"""

from __future__ import annotations

import random
import time

import pytest
from msgpu_verify import __main__ as cli
from msgpu_verify import bench
from msgpu_verify.batches import ShuffledBatches


class Rows:
    """A 1-D stand-in for a numpy array: len() and indexing by a sequence of indices (a copy)."""

    def __init__(self, values) -> None:
        self.values = list(values)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index):
        return [self.values[i] for i in index]


class Generator:
    """A stand-in for numpy.random.Generator: ``permutation(n)``, seeded; counts its draws."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.draws = 0

    def permutation(self, n: int):
        self.draws += 1
        return self.random.sample(range(n), n)


def source(n: int = 100, batch: int = 32, seed: int = 1) -> ShuffledBatches:
    # label i belongs to image "img-i": a batch that mixed them up would show
    return ShuffledBatches(Rows(f"img-{i}" for i in range(n)), Rows(range(n)), batch, Generator(seed))


def epoch(batches: ShuffledBatches):
    return [(list(x), list(y)) for x, y in batches]


def test_full_batches_only_each_sample_at_most_once_images_and_labels_paired():
    batches = source(n=100, batch=32)
    assert len(batches) == 3  # 100 // 32: the 4 left over are dropped, like the seed's drop_remainder
    one = epoch(batches)
    assert [len(x) for x, _ in one] == [32, 32, 32] and [len(y) for _, y in one] == [32, 32, 32]
    labels = [label for _, y in one for label in y]
    assert len(set(labels)) == 96 and set(labels) <= set(range(100))
    for x, y in one:
        assert x == [f"img-{label}" for label in y]
    assert len(source(n=31, batch=32)) == 0 and epoch(source(n=31, batch=32)) == []
    assert len(epoch(source(n=64, batch=32))) == 2


def test_every_epoch_draws_a_fresh_permutation():
    batches = source(n=1000, batch=10)
    first, second = epoch(batches), epoch(batches)
    assert batches.rng.draws == 2  # one permutation per iter(), not one per batch or per source
    assert first != second
    assert sorted(y for _, ys in first for y in ys) == sorted(y for _, ys in second for y in ys) == list(range(1000))
    assert [y for _, ys in first for y in ys] != list(range(1000))  # shuffled, not file order


def test_the_same_seed_gives_the_same_batches_another_seed_others():
    a, b, c = source(seed=7), source(seed=7), source(seed=8)
    assert [epoch(a), epoch(a)] == [epoch(b), epoch(b)]
    assert epoch(source(seed=7)) != epoch(c)


def test_a_source_refuses_what_would_feed_garbage():
    with pytest.raises(ValueError, match="100 images but 99 labels"):
        ShuffledBatches(Rows(range(100)), Rows(range(99)), 32, Generator(1))
    with pytest.raises(ValueError, match="batch size 0"):
        ShuffledBatches(Rows(range(100)), Rows(range(100)), 0, Generator(1))


def test_measure_feeder_times_building_and_drawing_one_epoch():
    def make():
        time.sleep(0.05)  # the direct loop cuts its Tensors here: that is feeder time too
        return iter(range(20))

    measured = bench.measure_feeder("stand-in", make, 32)
    assert measured["kind"] == "stand-in" and measured["batches"] == 20
    assert measured["seconds"] >= 0.05
    assert measured["images_per_s"] == pytest.approx(20 * 32 / measured["seconds"], rel=0.01)
    assert measured["images_per_s"] <= 20 * 32 / 0.05
    empty = bench.measure_feeder("empty", lambda: [], 32)
    assert (empty["batches"], empty["images_per_s"]) == (0, None)


def test_bound_by_the_feeder_below_twice_the_training_rate():
    assert bench.FEEDER_HEADROOM == 2.0
    assert bench.bound_by(199_999.0, 100_000.0) == "feeder"
    assert bench.bound_by(62_000.0, 90_000.0) == "feeder"  # a per-image feeder under a fast GPU
    assert bench.bound_by(200_000.0, 100_000.0) == "training"
    assert bench.bound_by(217_151.0, 6_338.8) == "training"  # LeNet5 on 2 CPU cores
    assert bench.bound_by(300.0, 100.0, headroom=4.0) == "feeder"
    for feeder, training in ((None, 100.0), (100.0, None), (0.0, 100.0), (100.0, 0.0), (None, None)):
        assert bench.bound_by(feeder, training) is None


def test_both_feeders_are_named_for_the_path_that_uses_them():
    assert "sink" in bench.FEEDER_KINDS[True] and "GeneratorDataset" in bench.FEEDER_KINDS[True]
    assert "direct loop" in bench.FEEDER_KINDS[False]


def test_the_bench_summary_line_shows_the_feeder_and_the_bound(monkeypatch, capsys, tmp_path):
    document = {
        "device": "CPU",
        "images_per_s": 6338.8,
        "accuracy": 0.9684,
        "step_time_ms": {"p50": 4.3, "p95": 5.0},
        "feeder": {"kind": bench.FEEDER_KINDS[False], "images_per_s": 217151.0, "seconds": 0.276, "batches": 1875},
        "bound_by": "training",
        "elapsed_s": 25.5,
    }
    monkeypatch.setattr("msgpu_verify.bench.run_bench", lambda **kwargs: dict(document))
    assert cli.main(["bench", "--data", str(tmp_path), "--json", str(tmp_path / "bench.json")]) == 0
    out = capsys.readouterr().out
    assert "bench: 6338.8 images/s (feeder alone 217151.0 images/s, bound by training), accuracy 0.9684" in out
