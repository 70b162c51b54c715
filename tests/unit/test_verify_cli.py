"""The verify command line refuses numbers out of range before anything runs (argparse exits 2).

Before, ``bench --epochs 0`` or a negative batch size trained nothing, exited 0 and recorded accuracy 0.11.
"""

from __future__ import annotations

import pytest
from msgpu_verify import __main__ as cli
from msgpu_verify import bench as bench_mod
from msgpu_verify import limits, serving

DATA = ["--data", "/nonexistent/mnist"]
COMMANDS = {
    "judge": ["judge"],
    "mnist": ["mnist", "--source", "/nonexistent", "--dest", "/nonexistent/out"],
    "bench": ["bench", *DATA],
    "report": ["report", "--input", "/nonexistent", "--out", "/nonexistent/out"],
}

REFUSED = [
    ("judge", "--timeout", "0", "a number of seconds from 1 to 86400"),
    ("judge", "--timeout", "-5", "a number of seconds from 1 to 86400"),
    ("judge", "--timeout", "nan", "a number of seconds from 1 to 86400"),
    ("judge", "--timeout", "inf", "a number of seconds from 1 to 86400"),
    ("judge", "--timeout", "soon", "a number of seconds from 1 to 86400"),
    ("mnist", "--timeout", "0", "a number of seconds from 1 to 86400"),
    ("mnist", "--retries", "-1", "a whole number from 0 to 100"),
    ("mnist", "--retries", "1.5", "a whole number from 0 to 100"),
    ("mnist", "--retries", "101", "a whole number from 0 to 100"),
    ("bench", "--epochs", "0", "a whole number from 1 to 1000"),
    ("bench", "--epochs", "-3", "a whole number from 1 to 1000"),
    ("bench", "--epochs", "2.5", "a whole number from 1 to 1000"),
    ("bench", "--epochs", "1001", "a whole number from 1 to 1000"),
    ("bench", "--batch-size", "0", "a whole number from 1 to 60000"),
    ("bench", "--batch-size", "-32", "a whole number from 1 to 60000"),
    ("bench", "--batch-size", "60001", "a whole number from 1 to 60000"),
    ("bench", "--lr", "0", "a learning rate, 0 < x <= 10"),
    ("bench", "--lr", "-0.01", "a learning rate, 0 < x <= 10"),
    ("bench", "--lr", "nan", "a learning rate, 0 < x <= 10"),
    ("bench", "--momentum", "-0.1", "a fraction from 0 to 1"),
    ("bench", "--momentum", "1.5", "a fraction from 0 to 1"),
    ("bench", "--random-seed", "-1", "a whole number from 0 to 4294967295"),
    ("bench", "--random-seed", str(2**32), "a whole number from 0 to 4294967295"),
    ("bench", "--timeout", "0", "a number of seconds from 1 to 86400"),
    ("bench", "--timeout", "-1", "a number of seconds from 1 to 86400"),
    ("report", "--slow-below", "0", "a fraction of the median, 0 < x <= 1"),
    ("report", "--slow-below", "80", "a fraction of the median, 0 < x <= 1"),
]


def parse(command: str, *extra: str):
    return cli.build_parser().parse_args([*COMMANDS[command], *extra])


@pytest.mark.parametrize(("command", "option", "value", "allowed"), REFUSED)
def test_out_of_range_numbers_are_refused_with_what_is_allowed(capsys, command, option, value, allowed):
    with pytest.raises(SystemExit) as stopped:
        parse(command, option, value)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert f"{option} {value!r}: allowed is {allowed}" in error, error


@pytest.mark.parametrize(
    ("command", "option", "value", "parsed"),
    [
        ("judge", "--timeout", "1", 1.0),
        ("judge", "--timeout", "86400", 86400.0),
        ("mnist", "--retries", "0", 0),
        ("mnist", "--timeout", "2.5", 2.5),
        ("bench", "--epochs", "1", 1),
        ("bench", "--batch-size", "60000", 60000),
        ("bench", "--lr", "10", 10.0),
        ("bench", "--momentum", "0", 0.0),
        ("bench", "--momentum", "1", 1.0),
        ("bench", "--random-seed", "0", 0),
        ("bench", "--random-seed", str(2**32 - 1), 2**32 - 1),
        ("bench", "--timeout", "75", 75.0),
        ("report", "--slow-below", "1", 1.0),
    ],
)
def test_the_bounds_themselves_are_allowed(command, option, value, parsed):
    args = parse(command, option, value)
    assert getattr(args, option.lstrip("-").replace("-", "_")) == parsed


def test_defaults_are_within_the_bounds():
    bench = parse("bench")
    assert (bench.epochs, bench.batch_size, bench.lr, bench.momentum, bench.random_seed) == (3, 32, 0.01, 0.9, 1)
    # the seed's hyperparameters, from bench.py's named defaults (the verify role passes its own epochs and limit)
    assert (bench.epochs, bench.batch_size, bench.lr, bench.momentum, bench.random_seed) == (
        bench_mod.DEFAULT_EPOCHS,
        bench_mod.BATCH_SIZE,
        bench_mod.LR,
        bench_mod.MOMENTUM,
        bench_mod.RANDOM_SEED,
    )
    assert bench.timeout is None  # run_bench's own default: BENCH_TIMEOUT_S, BENCH_QUICK_TIMEOUT_S with --quick
    assert (limits.bench_timeout_s(None, False), limits.bench_timeout_s(None, True)) == (900.0, 80.0)
    assert limits.bench_timeout_s(75, True) == 75.0
    assert parse("judge").timeout == 120.0
    assert (parse("mnist").timeout, parse("mnist").retries) == (60.0, 3)
    assert parse("report").slow_below == 0.8


def test_a_refused_bench_runs_nothing(monkeypatch, capsys):
    """`bench --epochs 0` stops in argparse: no training child, no bench.json with a made-up accuracy."""
    ran = []
    monkeypatch.setattr("msgpu_verify.bench.run_bench", lambda **kwargs: ran.append(kwargs) or {})
    with pytest.raises(SystemExit) as stopped:
        cli.main(["bench", *DATA, "--epochs", "0", "--batch-size", "-1"])
    assert stopped.value.code == 2 and ran == []
    assert "--epochs '0': allowed is a whole number from 1 to 1000" in capsys.readouterr().err


def test_every_command_bounds_its_numbers_one_way():
    """One factory (msgpu_verify._args.bounded) for the CLI, MNIST, Serving and the data-parallel check."""
    from msgpu_verify import _args, distributed, mnist

    assert cli._bounded is _args.bounded
    for module in (serving, mnist, distributed):
        assert module.bounded is _args.bounded, module.__name__
        assert not hasattr(module, "_bounded"), module.__name__
