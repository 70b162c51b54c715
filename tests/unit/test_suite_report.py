"""The suite's report reads each molecule scenario's idempotent re-run from its stage log (testbed/suite.py):
the time profile_tasks prints on the re-run's last line, and the play recap's counts. The excerpts below
are lines of a real `./toolkit test` log (molecule 26, ansible-core 2.19, profile_tasks), shortened."""

from __future__ import annotations

import time
from pathlib import Path

from testbed import suite

CONVERGE = """\
INFO     [default > converge] Executing
TASKS RECAP ********************************************************************
Thursday 03 December 2026  08:57:38 +0000 (0:00:00.061)       0:14:42.679 *****
msgpu-molecule-focal       : ok=319  changed=66   unreachable=0    failed=0    skipped=136  rescued=0    ignored=0
INFO     [default > converge] Executed: Successful
"""

IDEMPOTENCE = """\
INFO     [default > idempotence] Executing

PLAY [Check the inventory] *****************************************************

TASK [Check that the inventory has hosts to provision] *************************
Thursday 03 December 2026  08:57:40 +0000 (0:00:00.009)       0:00:00.009 *****
PLAY RECAP *********************************************************************
localhost                  : ok=4    changed=0    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
msgpu-molecule-focal       : ok=189  changed={changed}    unreachable=0    failed=0    skipped=139  rescued=0

\x1b[0;32mROLES RECAP\x1b[0m ********************************************************************
Thursday 03 December 2026  08:58:37 +0000 (0:00:00.052)       0:00:57.254 *****
===============================================================================
stack ------------------------------------------------------------------ 13.68s
INFO     [default > idempotence] Executed: Successful
INFO     [default > verify] Executing
Thursday 03 December 2026  09:01:00 +0000 (0:00:00.052)       0:03:00.000 *****
"""


def _log(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "molecule-default.log"
    path.write_text(text)
    return path


def test_the_rerun_is_read_from_its_own_section(tmp_path):
    log = _log(tmp_path, CONVERGE + IDEMPOTENCE.format(changed=0))
    assert suite.idempotent_rerun(log, "default") == {"seconds": 57.3, "ok": 189, "changed": 0, "skipped": 139}


def test_a_rerun_that_changed_something_says_so(tmp_path):
    log = _log(tmp_path, CONVERGE + IDEMPOTENCE.format(changed=2))
    assert suite.idempotent_rerun(log, "default")["changed"] == 2


def test_no_rerun_in_the_log_gives_none(tmp_path):
    assert suite.idempotent_rerun(_log(tmp_path, CONVERGE), "default") is None
    assert suite.idempotent_rerun(_log(tmp_path, CONVERGE + IDEMPOTENCE.format(changed=0)), "wheels") is None
    assert suite.idempotent_rerun(tmp_path / "missing.log", "default") is None


def test_the_report_lists_the_reruns_of_the_molecule_stages(tmp_path):
    log = _log(tmp_path, CONVERGE + IDEMPOTENCE.format(changed=0))
    results = [
        suite.Result("molecule default", True, 900.0, {}, "", log),
        suite.Result("fleet", True, 600.0, {}, "", log),
    ]
    runner = suite.Runner(tmp_path, tmp_path / "logs", {})
    report = suite.write_report(tmp_path / "report.json", {}, results, runner, 1000.0)
    assert report["idempotent_reruns"] == {"default": {"seconds": 57.3, "ok": 189, "changed": 0, "skipped": 139}}


def _stage(name: str, *commands: str) -> suite.Stage:
    return suite.Stage(name, name, [suite.Step(f"{name}-{i}", command) for i, command in enumerate(commands)])


def test_each_step_reports_the_cpu_its_processes_used_outside_the_containers(tmp_path):
    """A busy step's CPU (in a grandchild the shell waits for) is counted, a sleeping one's is not; a failed
    step's exit status stops its stage and is reported."""
    runner = suite.Runner(tmp_path, tmp_path / "logs", {"PATH": "/usr/bin:/bin"}, lanes=2)
    busy = "python3 -c 'import time; t = time.process_time(); exec(\"while time.process_time() - t < 1.0: pass\")'"
    results = {r.stage: r for r in runner.run([_stage("busy", busy), _stage("idle", "sleep 1", "exit 3", "true")])}
    assert results["busy"].ok and results["busy"].cpu["busy-0"] >= 0.9, results["busy"]
    idle = results["idle"]
    assert not idle.ok and idle.failed_step == "idle-1 (exit 3)", idle
    assert idle.cpu["idle-0"] < 0.5 and set(idle.cpu) == {"idle-0", "idle-1"}, idle
    report = suite.write_report(tmp_path / "report.json", {}, list(results.values()), runner, 10.0)
    assert report["stages"]["busy"]["controller_cpu_seconds"] >= 0.9
    assert report["cpu_seconds"]["machine"] >= 0.9  # the whole machine was busy at least that long


def test_stages_started_in_the_background_give_their_results_when_waited_for(tmp_path):
    runner = suite.Runner(tmp_path, tmp_path / "logs", {"PATH": "/usr/bin:/bin"}, lanes=1)
    flag = tmp_path / "flag"
    wait = runner.start([_stage("first", f"touch {flag}"), _stage("second", f"test -f {flag}")])
    results = wait()
    assert [(r.stage, r.ok) for r in results] == [("first", True), ("second", True)]
    assert (tmp_path / "logs" / "second.log").read_text().count("### second-0") == 1


def test_the_unit_stage_refuses_to_build_the_mirror_and_names_the_marker(monkeypatch, tmp_path):
    """`./toolkit test` runs the unit tests not marked `prepared` while it builds the fixture mirror: one of
    them that reads the mirror fails at once, naming the marker, instead of racing the build."""
    from testbed import fixtures, scenarios

    monkeypatch.setenv("MSGPU_NO_MIRROR_BUILD", "1")
    try:
        fixtures.build_mirror(cache=tmp_path)
    except fixtures.FixtureError as exc:
        assert "@pytest.mark.prepared" in str(exc) and "`fixtures` stage" in str(exc)
    else:
        raise AssertionError("build_mirror ran with MSGPU_NO_MIRROR_BUILD set")
    assert not (tmp_path / "mirror").exists()
    monkeypatch.setattr(scenarios, "isolated_copy", lambda: tmp_path / "copy")
    unit, prepared = scenarios.unit_stages({})
    assert unit.steps[0].env["MSGPU_NO_MIRROR_BUILD"] == "1" and "-m 'not prepared'" in unit.steps[0].command
    assert "MSGPU_NO_MIRROR_BUILD" not in prepared.steps[0].env and "-m prepared" in prepared.steps[0].command
    for stage in (unit, prepared):  # both in the one copy of the tree
        assert stage.steps[0].command.startswith(f"cd {tmp_path / 'copy'} && pytest "), stage.steps[0].command


def test_container_cpu_is_summed_by_name_and_keeps_the_last_sample_of_a_container_gone(tmp_path, monkeypatch):
    """Two containers of the same name one after another (a host re-created) add up; a container whose cgroup
    went away keeps its last sampled CPU; each name is read once per container."""
    cgroups = tmp_path / "docker"
    monkeypatch.setattr(suite, "DOCKER_CPU", cgroups / "cpuacct.usage")
    asked: list[str] = []
    names = {"a" * 64: "msgpu-fleet-1", "b" * 64: "msgpu-fleet-1", "c" * 64: "msgpu-molecule-focal"}
    monkeypatch.setattr(suite, "_container_name", lambda cid: asked.append(cid) or names[cid])

    def usage(cid: str, seconds: float) -> None:
        (cgroups / cid).mkdir(parents=True, exist_ok=True)
        (cgroups / cid / "cpuacct.usage").write_text(f"{int(seconds * 1e9)}\n")

    runner = suite.Runner(tmp_path, tmp_path / "logs", {})
    usage("a" * 64, 2.0)
    usage("c" * 64, 10.0)
    runner.sample()
    usage("a" * 64, 5.0)
    runner.sample()
    for path in (cgroups / ("a" * 64)).iterdir():
        path.unlink()
    (cgroups / ("a" * 64)).rmdir()
    usage("b" * 64, 1.5)
    runner.sample()
    assert runner.cpu_by_container() == {"msgpu-molecule-focal": 10.0, "msgpu-fleet-1": 6.5}
    assert sorted(asked) == sorted(names)
    report = suite.write_report(tmp_path / "report.json", {}, [], runner, 1.0)
    assert list(report["container_cpu_seconds"]) == ["msgpu-molecule-focal", "msgpu-fleet-1"]


def test_the_report_says_which_stages_ran_when_the_disk_was_fullest(tmp_path, monkeypatch):
    """Only a new low of the free disk moves `peak_disk_at`: the seconds since the runner began and each stage
    that ran then, with how long it had run."""
    free = iter([100, 60, 80, 70, 90])
    monkeypatch.setattr(suite, "_free_bytes", lambda root: next(free))
    monkeypatch.setattr(suite, "_container_cpu", lambda: {})
    runner = suite.Runner(tmp_path, tmp_path / "logs", {})  # 100 free at its start
    now = time.monotonic()
    runner.running = {"faults": (now - 30, tmp_path / "f.log"), "molecule default": (now - 600, tmp_path / "d.log")}
    runner.sample()  # 60: the low
    runner.running = {"fixtures": (now - 5, tmp_path / "x.log")}
    runner.sample()  # 80
    runner.sample()  # 70: above the low
    assert runner.peak_used == 40
    assert runner.peak_at["stages"] == {"faults": 30, "molecule default": 600}
    report = suite.write_report(tmp_path / "report.json", {}, [], runner, 1.0, free_before=100)
    assert report["peak_disk_at"] == runner.peak_at


def test_a_stage_marked_alone_runs_when_no_other_does(tmp_path):
    """The `fixtures` stage is `alone` (testbed/scenarios.py: suite_stages): listed among others, it waits for the
    running ones to end and the rest wait for it, while the others still share the lanes."""

    def timed(name: str, seconds: float) -> str:
        return f"date +%s.%N > {tmp_path / name}.start && sleep {seconds} && date +%s.%N > {tmp_path / name}.end"

    stages = [_stage("a", timed("a", 1.0)), _stage("b", timed("b", 0.5)), _stage("c", timed("c", 0.5))]
    stages[1].alone = True
    stages.append(_stage("d", timed("d", 0.5)))
    runner = suite.Runner(tmp_path, tmp_path / "logs", {"PATH": "/usr/bin:/bin"}, lanes=2)
    assert all(r.ok for r in runner.run(stages))
    span = {n: tuple(float((tmp_path / f"{n}.{e}").read_text()) for e in ("start", "end")) for n in "abcd"}

    def overlap(x: str, y: str) -> bool:
        return span[x][0] < span[y][1] and span[y][0] < span[x][1]

    assert not any(overlap("b", other) for other in "acd"), span
    assert overlap("a", "c"), span  # the lanes still run two at once
