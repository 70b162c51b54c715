"""The test suite's stage runner: independent container stages run side by side, a few at a time.

Most of a stage's time is one busy core (Ansible's controller, dpkg, a compiler, a checksum) or waiting
(downloads, async polls), so on a 2-core machine two stages at once finish the suite in far less time
than one after another. Each stage writes its output to its own log (artifacts/test-logs/<stage>.log);
the runner prints a line when a stage starts and ends, a progress line every minute (what runs, its
last line, the free disk), the tail of each finished stage's log (all of it, up to a limit, when it
failed), and at the end every stage's time, the peak disk use and a JSON file with those numbers.

A stage is a list of steps (shell commands run in order, stopping at the first that fails) and cleanup
commands that always run. A failed stage does not stop the others: the run reports every failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# How many lines of a stage's log to print when it passed / failed.
TAIL_OK = 15
TAIL_FAILED = 400


@dataclass
class Step:
    name: str
    command: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Stage:
    name: str
    description: str
    steps: list[Step]
    cleanup: list[str] = field(default_factory=list)
    # Stages with the same `alone` key never run at the same time as any other stage (timing-sensitive).
    alone: bool = False


@dataclass
class Result:
    stage: str
    ok: bool
    seconds: float
    steps: dict[str, float]
    failed_step: str
    log: Path
    # CPU seconds of each step's processes on this machine, outside the containers (see _run_stage).
    cpu: dict[str, float] = field(default_factory=dict)


# Docker's cgroup (cgroup v1's cpuacct): the CPU time of every process in every container, exited ones too.
DOCKER_CPU = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")


def _cpu_seconds() -> dict[str, float]:
    """The machine's busy CPU seconds since boot (all cores: user, nice, system, irq, softirq), and Docker's
    containers' where their cgroup is readable (cgroup v1)."""
    found: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        found["machine"] = sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError, ValueError):
        found["containers"] = int(DOCKER_CPU.read_text()) / 1e9
    return found


def _container_cpu() -> dict[str, float]:
    """CPU seconds of each running container so far (cgroup v1: docker/<id>/cpuacct.usage), by full ID."""
    found: dict[str, float] = {}
    for usage in DOCKER_CPU.parent.glob("*/cpuacct.usage"):
        with contextlib.suppress(OSError, ValueError):
            found[usage.parent.name] = int(usage.read_text()) / 1e9
    return found


def _container_name(container_id: str) -> str:
    """The container's name (without Docker's leading slash), or its short ID once it is gone."""
    try:
        done = subprocess.run(
            ["docker", "inspect", "--format", "{{.Name}}", container_id],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return container_id[:12]
    return done.stdout.strip().lstrip("/") or container_id[:12]


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f}"


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - 4096))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    # profile_tasks prints a date line after each task header: the task's own line says more.
    lines = [line for line in lines if not _TIMESTAMP.match(line) and set(line) != {"*"}]
    tasks = [line for line in lines if line.startswith(("TASK [", "PLAY [", "RUNNING HANDLER ["))]
    last = lines[-1] if lines else ""
    if tasks and lines and lines[-1].startswith(("ok:", "changed:", "skipping:", "included:")):
        last = tasks[-1]
    return last.rstrip(" *")[:150]


_TIMESTAMP = re.compile(r"^\w+day \d\d \w+ \d{4}\s+\d\d:\d\d:\d\d")


def _tail(path: Path, count: int) -> str:
    lines = path.read_text(errors="replace").splitlines()
    cut = "" if len(lines) <= count else f"... ({len(lines) - count} earlier lines in {path})\n"
    return cut + "\n".join(lines[-count:])


class Runner:
    """Runs stages `lanes` at a time from `root`, logging into `log_dir`."""

    def __init__(
        self,
        root: Path,
        log_dir: Path,
        base_env: dict[str, str],
        lanes: int = 2,
        tick: Callable[[], int] | None = None,
    ) -> None:
        self.root, self.log_dir, self.base_env, self.lanes = root, log_dir, base_env, max(1, lanes)
        # Called with each progress line (every minute) while stages run: returns bytes freed (disk upkeep).
        self.tick = tick
        self.freed = 0
        self.lock = threading.Lock()
        self.running: dict[str, tuple[float, Path]] = {}
        self.results: list[Result] = []
        self.start_free = _free_bytes(root)
        self.min_free = self.start_free
        # When the least free disk was sampled: seconds since the runner was made, and each running stage's
        # seconds since it started (what to look at when the peak grows).
        self.peak_at: dict = {}
        self.start_cpu = _cpu_seconds()
        self.created = time.monotonic()
        self.stop = threading.Event()
        # Each container's CPU seconds as last sampled (by ID; a container's cgroup goes with it, so a short-lived
        # one's last few seconds are missed), and its name, read once when it first appears.
        self.container_cpu: dict[str, float] = {}
        self.container_names: dict[str, str] = {}

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def _sample_disk(self) -> None:
        """Every 3 s: the free disk, and each container's CPU time (the containers' share by name at the end)."""
        while not self.stop.wait(3.0):
            self.sample()

    def sample(self) -> None:
        free = _free_bytes(self.root)
        cpu = _container_cpu()
        names = {cid: _container_name(cid) for cid in cpu if cid not in self.container_names}
        with self.lock:
            if free < self.min_free:
                now = time.monotonic()
                running = {name: round(now - started) for name, (started, _) in self.running.items()}
                self.peak_at = {"seconds": round(now - self.created), "stages": running}
            self.min_free = min(self.min_free, free)
            self.container_names.update(names)
            for cid, seconds in cpu.items():
                self.container_cpu[cid] = max(seconds, self.container_cpu.get(cid, 0.0))

    def cpu_by_container(self) -> dict[str, float]:
        """CPU seconds each container name used while the runner ran (containers that share a name over the run,
        one after another, add up), most first."""
        totals: dict[str, float] = {}
        with self.lock:
            for cid, seconds in self.container_cpu.items():
                name = self.container_names.get(cid, cid[:12])
                totals[name] = totals.get(name, 0.0) + seconds
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def _progress(self, every: float) -> None:
        while not self.stop.wait(every):
            with self.lock:
                running = dict(self.running)
            now = time.monotonic()
            parts = [f"{name} {now - started:.0f} s: {_last_line(log)}" for name, (started, log) in running.items()]
            if self.tick is not None:
                try:
                    self.freed += self.tick()
                except Exception as exc:  # upkeep must never stop the run
                    self.say(f"... disk upkeep failed: {exc}")
            self.say(f"... [{_gib(_free_bytes(self.root))} GiB free] " + (" | ".join(parts) or "idle"))

    def _run_stage(self, stage: Stage) -> Result:
        log = self.log_dir / f"{stage.name.replace(' ', '-')}.log"
        started = time.monotonic()
        with self.lock:
            self.running[stage.name] = (started, log)
        self.say(f"\n==> {stage.name}: {stage.description} [{_gib(_free_bytes(self.root))} GiB free]")
        steps: dict[str, float] = {}
        cpu: dict[str, float] = {}
        failed = ""
        with open(log, "w") as out:
            try:
                for step in stage.steps:
                    step_started = time.monotonic()
                    out.write(f"\n### {step.name}: {step.command}\n")
                    out.flush()
                    proc = subprocess.Popen(
                        step.command,
                        shell=True,
                        cwd=self.root,
                        env={**self.base_env, **step.env},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                    # wait4: the step's CPU time with every descendant it waited for (Ansible and its workers,
                    # the docker CLI, pytest; not what runs inside the containers).
                    _, status, usage = os.wait4(proc.pid, 0)
                    proc.returncode = code = os.waitstatus_to_exitcode(status)
                    steps[step.name] = time.monotonic() - step_started
                    cpu[step.name] = usage.ru_utime + usage.ru_stime
                    if code != 0:
                        failed = f"{step.name} (exit {code})"
                        break
            finally:
                # Cleanup sees what the steps saw (molecule needs the scenario's image variables).
                cleanup_env = {**self.base_env, **{k: v for step in stage.steps for k, v in step.env.items()}}
                for command in stage.cleanup:
                    out.write(f"\n### cleanup: {command}\n")
                    out.flush()
                    subprocess.run(
                        command,
                        shell=True,
                        cwd=self.root,
                        env=cleanup_env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        check=False,
                    )
        seconds = time.monotonic() - started
        with self.lock:
            del self.running[stage.name]
        result = Result(stage.name, not failed, seconds, steps, failed, log, cpu)
        if failed:
            self.say(
                f"\n<== {stage.name}: FAILED at {failed} after {seconds:.0f} s "
                f"[{_gib(_free_bytes(self.root))} GiB free]; its log:\n{_tail(log, TAIL_FAILED)}"
            )
        else:
            self.say(
                f"\n<== {stage.name}: ok in {seconds:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in steps.items())}) "
                f"[{_gib(_free_bytes(self.root))} GiB free]; last lines of {log}:\n{_tail(log, TAIL_OK)}"
            )
        return result

    def run(self, stages: list[Stage], progress_every: float = 60.0) -> list[Result]:
        """Run every stage; a stage marked `alone` waits until nothing else runs and blocks the others."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        pending = list(stages)
        cond = threading.Condition()
        active: list[Stage] = []
        threads = [
            threading.Thread(target=self._sample_disk, daemon=True),
            threading.Thread(target=self._progress, args=(progress_every,), daemon=True),
        ]
        for thread in threads:
            thread.start()

        def fits(stage: Stage) -> bool:
            if not active:
                return True
            return not stage.alone and not any(s.alone for s in active) and len(active) < self.lanes

        def worker() -> None:
            while True:
                with cond:
                    while True:
                        if not pending:
                            return
                        chosen = next((s for s in pending if fits(s)), None)
                        if chosen is not None:
                            pending.remove(chosen)
                            active.append(chosen)
                            break
                        cond.wait()
                result = self._run_stage(chosen)
                with cond:
                    active.remove(chosen)
                    self.results.append(result)
                    cond.notify_all()

        workers = [threading.Thread(target=worker) for _ in range(self.lanes)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        self.stop.set()
        self.min_free = min(self.min_free, _free_bytes(self.root))
        return self.results

    def start(self, stages: list[Stage], progress_every: float = 60.0) -> Callable[[], list[Result]]:
        """Run `stages` in the background (as `run` does); returns a call that waits for them and gives their
        results. `./toolkit test` runs the stages that need no container (lint, most unit tests) this way while
        it prepares the images and fixtures."""
        done: list[Result] = []
        thread = threading.Thread(target=lambda: done.extend(self.run(stages, progress_every)), daemon=True)
        thread.start()

        def wait() -> list[Result]:
            thread.join()
            return done

        return wait

    def cpu_used(self) -> dict[str, float]:
        """CPU seconds the whole machine spent since the runner was made (`machine`: every core's busy time),
        and what of it ran in Docker's containers (`containers`, where the cgroup is readable)."""
        now = _cpu_seconds()
        return {key: now[key] - self.start_cpu[key] for key in now if key in self.start_cpu}

    @property
    def peak_used(self) -> int:
        """The most disk the run took beyond what was in use when it started."""
        return max(0, self.start_free - self.min_free)


# The idempotent re-run of a molecule scenario (its `idempotence` action: site.yml again on the converged
# host, which must report changed=0), read from the stage's log: profile_tasks prints the time since the
# playbook started on each task's line, and the play recap counts the tasks. The goals for the re-run
# (benchmarks, not tests: the suite runs it beside another stage, so it reads slower than on a quiet machine).
IDEMPOTENT_GOALS = {"default": 30.0, "nvidia_repo": 45.0}
_ELAPSED = re.compile(r"^\w+day \d\d \w+ \d{4}\s+\d\d:\d\d:\d\d \S+ \(\S+\)\s+(\d+):(\d\d):(\d\d(?:\.\d+)?)")
_RECAP = re.compile(r"^\S+\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=\d+\s+skipped=(\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def idempotent_rerun(log: Path, scenario: str) -> dict | None:
    """{seconds, ok, changed, skipped} of scenario's idempotence run in `log`, or None when the log has none."""
    try:
        lines = _ANSI.sub("", log.read_text(errors="replace")).splitlines()
    except OSError:
        return None
    start = f"[{scenario} > idempotence] Executing"
    inside, seconds, counts = False, None, None
    for line in lines:
        if start in line:
            inside, seconds, counts = True, None, None
        elif inside and f"[{scenario} > idempotence] Executed" in line:
            break
        elif inside:
            elapsed = _ELAPSED.match(line.strip())
            if elapsed:
                hours, minutes, secs = elapsed.groups()
                seconds = int(hours) * 3600 + int(minutes) * 60 + float(secs)
            recap = _RECAP.match(line.strip())
            if recap and not line.strip().startswith("localhost"):
                counts = [int(value) for value in recap.groups()]
    if not inside or seconds is None or counts is None:
        return None
    return {"seconds": round(seconds, 1), "ok": counts[0], "changed": counts[1], "skipped": counts[2]}


def write_report(
    path: Path, timings: dict[str, float], results: list[Result], runner: Runner, total: float, free_before: int = 0
) -> dict:
    """The run's numbers as JSON. `free_before`: the free disk before the steps that ran ahead of the runner
    (the prepare step's caches), so the peak with them counts too."""
    free_before = free_before or runner.start_free
    report = {
        "total_seconds": round(total, 1),
        "lanes": runner.lanes,
        "peak_disk_used_with_caches_gib": round(max(0, free_before - runner.min_free) / 2**30, 1),
        "free_disk_before_prepare_gib": round(free_before / 2**30, 1),
        "peak_disk_used_gib": round(runner.peak_used / 2**30, 1),
        "free_disk_at_start_gib": round(runner.start_free / 2**30, 1),
        "disk_freed_by_links_gib": round(runner.freed / 2**30, 1),
        "peak_disk_at": runner.peak_at,
        "serial_stages": {k: round(v, 1) for k, v in timings.items()},
        "idempotent_reruns": {
            r.stage[len("molecule ") :]: rerun
            for r in results
            if r.stage.startswith("molecule ")
            and (rerun := idempotent_rerun(r.log, r.stage[len("molecule ") :])) is not None
        },
        "stages": {
            r.stage: {
                "ok": r.ok,
                "seconds": round(r.seconds, 1),
                "steps": {k: round(v, 1) for k, v in r.steps.items()},
                "controller_cpu_seconds": round(sum(r.cpu.values()), 1),
            }
            for r in results
        },
        # The stages' wall time (the lanes), and the CPU time the machine spent in it (Runner.cpu_used).
        "stages_seconds": round(time.monotonic() - runner.created, 1),
        "cpu_seconds": {k: round(v, 1) for k, v in runner.cpu_used().items()},
        "container_cpu_seconds": {k: round(v, 1) for k, v in runner.cpu_by_container().items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report
