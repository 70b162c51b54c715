"""Each check's worst case is computed once, in Python (msgpu_verify/limits.py), and Ansible waits longer (issue 16
part 6): the verify role's ``async:`` limits are rendered from the YAML with Ansible's own templar for quick on/off,
--compare-seed on/off, GPU/CPU judge, hosts with and without a GPU, and compared with the worst case Python
computes for the very command line the task runs. Before, with --compare-seed, the benchmark's async limit
(2 x 1800 + 120 = 3720 s) gave up before Python's own worst case (1800 + 3 x 1800 s): a real hang was killed by
Ansible before the check could record HANG.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from msgpu_verify import __main__ as cli
from msgpu_verify import _proc, bench, distributed, judge, limits, serving, smoke, warmup

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "verify"
TIMED = {"warmup", "judge", "bench", "distributed", "serving"}


def trust(value: Any) -> Any:
    """YAML as Ansible sees a role's files: every string may be a template."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trust(v) for v in value]
    if isinstance(value, dict):
        return {k: trust(v) for k, v in value.items()}
    return value


def tasks(items: List[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
    for task in items:
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks(task.get(key) or [])


def role_tasks() -> List[Dict[str, Any]]:
    return [
        t for name in ("main.yml", "serving.yml") for t in tasks(yaml.safe_load((ROLE / "tasks" / name).read_text()))
    ]


def role_facts() -> Dict[str, Any]:
    """The first task's set_fact (the wrappers, __verify_argv) and the role's vars (the formulas' constants,
    __verify_limits, which every task file of the role sees)."""
    first = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())[0]
    return {**first["ansible.builtin.set_fact"], **yaml.safe_load((ROLE / "vars" / "main.yml").read_text())}


def shared(stack: Dict[str, Any]) -> Dict[str, Any]:
    """stack_resolved.shared as the stack role publishes it (roles/stack/vars/main.yml) for `stack`."""
    stack_role = ROOT / "roles" / "stack"
    variables = {
        **yaml.safe_load((stack_role / "defaults" / "main.yml").read_text()),
        **yaml.safe_load((stack_role / "vars" / "main.yml").read_text()),
        "__stack_result": {"stack": stack},
        "role_path": str(stack_role),
    }
    return Templar(loader=DataLoader(), variables=trust(variables)).template(trust(variables["__stack_shared"]))


def templar(**settings: Any) -> Templar:
    no_gpu = settings.pop("no_gpu", False)
    variables: Dict[str, Any] = dict(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))
    variables.update(role_facts())
    stack = {
        "name": "ms151",
        "no_gpu": no_gpu,
        "mindspore": {"version": "1.5.1"},
        "cuda": {"version": "11.1"},
        "cudnn": {"version": "8.0.5", "major": 8},
        "serving": {"enabled": True},
        "mnist": {},
    }
    variables.update(
        playbook_dir=str(ROOT / "playbooks"),
        role_path=str(ROLE),
        inventory_hostname="gpu01",
        stack_resolved={**stack, "shared": shared(stack)},
        stack_host={"gpus": [] if no_gpu else [{"name": "NVIDIA GeForce RTX 3090"}]},
        verify_serving=True,
    )
    variables.update(settings)
    return Templar(loader=DataLoader(), variables=trust(variables))


def timed_tasks(render: Templar) -> Dict[str, Tuple[float, argparse.Namespace]]:
    """Every task with an async limit: its rendered limit and its command line as the command's parser reads it."""
    wrapper = len(render.template(trust(role_facts()["__verify_argv"])))
    found: Dict[str, Tuple[float, argparse.Namespace]] = {}
    for task in role_tasks():
        if "async" not in task:
            continue
        argv = [str(a) for a in render.template(trust(task["ansible.builtin.command"]["argv"]))]
        args = cli.build_parser().parse_args(argv[wrapper:])
        assert args.command not in found, f"two async tasks run {args.command}"
        found[args.command] = (float(render.template(trust(task["async"]))), args)
    return found


SETTINGS = [
    pytest.param({}, id="defaults"),
    pytest.param({"verify_quick": True}, id="quick"),
    pytest.param({"verify_compare_seed": True}, id="compare-seed"),
    pytest.param({"verify_quick": True, "verify_compare_seed": True}, id="quick-compare-seed"),
    pytest.param({"verify_judge_device": "CPU", "no_gpu": True}, id="no-gpu-cpu-judge"),
    pytest.param(
        {
            "verify_compare_seed": True,
            "verify_bench_timeout": 300,
            "verify_judge_timeout": 7,
            "verify_warmup_timeout": 3600,
            "verify_distributed_timeout": 10,
            "verify_serving_timeout": 5,
            "verify_async_margin": 1,
        },
        id="own-limits-margin-1",
    ),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_every_async_limit_is_pythons_worst_case_plus_the_margin(settings):
    render = templar(**settings)
    margin = float(render.template(trust_as_template("{{ verify_async_margin | int }}")))
    found = timed_tasks(render)
    assert set(found) == TIMED, "every timed check has an async limit compared here"
    for command, (async_s, args) in found.items():
        worst = limits.worst_case_s(args)
        assert async_s > worst, f"{command}: Ansible's async {async_s:g} s <= Python's worst case {worst:g} s"
        assert async_s == worst + margin, f"{command}: async {async_s:g} s is not {worst:g} s + margin {margin:g} s"


def test_compare_seed_waits_for_the_seed_script():
    """The review's case: 1800 s benchmark with the seed: 1800 + 15 + 3 x 1800 + 15 + 30 = 7260 s, + 60."""
    found = timed_tasks(templar(verify_compare_seed=True))
    async_s, args = found["bench"]
    assert args.compare_seed and args.timeout == 1800.0
    assert limits.worst_case_s(args) == 7260.0 and async_s == 7320.0


@pytest.mark.parametrize(("quick", "epochs"), [(False, bench.DEFAULT_EPOCHS), (True, bench.QUICK_EPOCHS)])
def test_the_role_passes_epochs_and_quick_explicitly(quick, epochs):
    args = timed_tasks(templar(verify_quick=quick))["bench"][1]
    assert (args.epochs, args.quick) == (epochs, quick)
    assert args.timeout == (75.0 if quick else 1800.0)


def test_the_roles_constants_are_pythons():
    assert role_facts()["__verify_limits"] == limits.constants()


def test_the_constants_cover_what_the_modules_really_wait_for():
    assert judge.DRIVER_PROBE_TIMEOUT <= limits.DRIVER_PROBE_S
    assert len(serving.STEPS) == limits.SERVING_CHILDREN
    assert inspect.signature(distributed.count_gpus).parameters["timeout_s"].default == limits.NVIDIA_SMI_S
    # kill_group: SIGTERM + grace, SIGKILL + 2 s; run_child then reads the pipe for up to 10 s
    grace = inspect.signature(_proc.kill_group).parameters["grace_s"].default
    assert grace + 2.0 + 10.0 <= limits.CHILD_KILL_S
    assert inspect.signature(smoke.gpu_smoke).parameters["probe_timeout"].default == limits.GPU_SMOKE_PROBE_S


def test_the_gpu_smoke_tasks_async_limit_exceeds_pythons_worst_case():
    smoke_tasks = yaml.safe_load((ROLE / "tasks" / "gpu_smoke.yml").read_text())
    task = next(t for t in smoke_tasks if "async" in t)
    render = templar(**smoke_tasks[0]["ansible.builtin.set_fact"])
    argv = [str(a) for a in render.template(trust(task["ansible.builtin.command"]["argv"]))]
    args = cli.build_parser().parse_args(argv[len(role_facts()["__verify_argv"]) :])
    assert args.command == "gpu-smoke"
    worst = limits.worst_case_s(args)
    margin = int(render.template(trust("{{ verify_async_margin }}")))
    assert float(render.template(trust(task["async"]))) == worst + margin, (worst, margin)


# ---------------------------------------------------------------- the formulas against what the commands do


class Clock:
    """A module's ``time`` with a monotonic clock that only children move; everything else is the real module."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class Children:
    """Stands in for run_child: every child runs into its limit and then takes CHILD_KILL_S to be killed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
        self.clock = Clock()
        self.limits: List[float] = []
        monkeypatch.setattr(module, "time", self.clock)
        monkeypatch.setattr(module, "run_child", self)

    def __call__(self, argv, timeout_s, env=None, cwd=None):
        self.limits.append(float(timeout_s))
        self.clock.now += float(timeout_s) + limits.CHILD_KILL_S
        return _proc.ChildResult(returncode=-9, output="", timed_out=True, elapsed_s=float(timeout_s), pgid=0)


@pytest.mark.parametrize("compare_seed", [False, True])
@pytest.mark.parametrize(("quick", "timeout"), [(False, None), (True, None), (False, 1800.0), (True, 75.0)])
def test_bench_worst_case_is_its_childrens_plus_its_own_work(monkeypatch, quick, timeout, compare_seed):
    children = Children(monkeypatch, bench)
    monkeypatch.setattr("msgpu_verify.mnist.is_complete", lambda path: True)
    result = bench.run_bench(data="/prepared", quick=quick, compare_seed=compare_seed, timeout_s=timeout)
    limit = limits.bench_timeout_s(timeout, quick)
    assert result["timeout_s"] == limit
    assert children.limits == [limit] + ([limits.SEED_TIMEOUT_FACTOR * limit] if compare_seed else [])
    args = cli.build_parser().parse_args(
        ["bench", "--data", "/prepared"]
        + (["--quick"] if quick else [])
        + (["--compare-seed"] if compare_seed else [])
        + ([f"--timeout={timeout:g}"] if timeout else [])
    )
    assert limits.worst_case_s(args) == children.clock.now + limits.OWN_WORK_S == result["elapsed_s"] + 30


@pytest.mark.parametrize(("device", "probe"), [("GPU", True), ("CPU", False)])
def test_judge_worst_case_is_the_probes_plus_the_driver_probes(monkeypatch, device, probe):
    children = Children(monkeypatch, judge)
    judge.judge("python3", device, 42.0)
    assert children.limits == [42.0] + ([judge.DRIVER_PROBE_TIMEOUT] if probe else [])
    args = cli.build_parser().parse_args(["judge", "--device", device, "--timeout", "42"])
    assert limits.worst_case_s(args) == children.clock.now + limits.OWN_WORK_S


@pytest.mark.parametrize("timeout", [2.0, 400.0, 1800.0])
def test_warmup_worst_case_covers_the_identity_lookup_and_the_probe(monkeypatch, tmp_path, timeout):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    children = Children(monkeypatch, warmup)
    monkeypatch.setattr(warmup.gpu_probe, "probe_nvml", lambda path: {})
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "1")
    document = warmup.warmup("python3", timeout, root=str(tmp_path), force=True)
    assert document["verdict"] == "HANG" and len(children.limits) == 2
    args = cli.build_parser().parse_args(["warmup", "--timeout", f"{timeout:g}"])
    assert children.clock.now + limits.OWN_WORK_S <= limits.worst_case_s(args)


def test_serving_worst_case_covers_one_child_per_step():
    args = cli.build_parser().parse_args(
        ["serving", "--checkpoint", "c", "--data", "d", "--servables", "s", "--device", "none", "--timeout", "9"]
    )
    assert limits.worst_case_s(args) == limits.SERVING_CHILDREN * (9.0 + limits.CHILD_KILL_S) + limits.OWN_WORK_S
    auto = cli.build_parser().parse_args(["serving", "--checkpoint", "c", "--data", "d", "--servables", "s"])
    assert limits.worst_case_s(auto) == limits.NVIDIA_SMI_S + limits.serving_s(300.0, count_gpus=False)


def test_the_limits_command_prints_a_command_lines_worst_case(capsys):
    assert cli.main(["limits", "bench", "--data", "d", "--timeout", "1800", "--compare-seed"]) == 0
    assert capsys.readouterr().out.strip() == "7260"
    assert cli.main(["limits", "--json", "judge", "--timeout", "180"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["worst_case_s"] == 180 + 15 + 60 + 15 + 30 and document["constants"] == limits.constants()
    assert cli.main(["limits", "report", "--input", "i", "--out", "o"]) == 2
    assert "name one of warmup, judge, bench, distributed, serving, gpu-smoke" in capsys.readouterr().err
    assert cli.main(["limits", "gpu-smoke", "--out", "o", "--data", "d"]) == 0
    assert capsys.readouterr().out.strip() == "5130"  # 120+15 + 2 x (1800+30) + (600+15+60+15) + (600+15) + 30


def test_quick_mode_says_what_it_keeps():
    """--quick keeps every training and test image (nothing is sliced) and trains at most QUICK_EPOCHS epochs."""
    assert not hasattr(bench, "QUICK_TRAIN") and not hasattr(bench, "QUICK_TEST")
    assert f"at most {bench.QUICK_EPOCHS} epochs instead of {bench.DEFAULT_EPOCHS}" in bench.QUICK_NOTE
    assert "all 60000 training images" in bench.QUICK_NOTE and "all 10000 test images" in bench.QUICK_NOTE
