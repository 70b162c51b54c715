"""The project's checks: lint, and the whole test suite as CI runs it (on the test bed, testbed/)."""

from __future__ import annotations

import concurrent.futures
import os
import shlex
import shutil
import time

from invoke import Context, Exit, task

from cli import local
from cli.common import RESULTS, ROOT, env, run, timed

# The molecule scenarios (testbed/scenarios.py SCENARIOS, in its order), named here so that `--help` and
# `--list` need not load the test bed; tests/unit/test_entry_points.py keeps the two equal.
SCENARIO_NAMES = ("default", "runfile", "nvidia_repo", "wheels")


# The lint steps: (what, command), run from the project root with the venv first on PATH.
LINT_STEPS = (
    ("yamllint", "yamllint --strict ."),
    ("ansible-lint (production)", "ansible-lint --profile production --offline"),
    ("ruff", "ruff check ."),
    ("ruff format", "ruff format --check ."),
    ("site.yml syntax check", "ansible-playbook --syntax-check -i inventory/example/hosts.yml playbooks/site.yml"),
)


@task
def lint(c: Context) -> None:
    """yamllint, ansible-lint (production profile), ruff (lint and format), and a syntax check of site.yml."""
    for what, cmd in LINT_STEPS:
        run(c, cmd, what=what)


@task(
    help={
        "fast": "Lint and unit tests only (no containers).",
        "keyword": "Only tests whose names match this pytest -k expression (skips lint and molecule).",
        "scenario": f"Only this molecule scenario ({', '.join(SCENARIO_NAMES)}); "
        "skips lint, unit and integration tests.",
        "lanes": "How many stages run at the same time (default 2, or MSGPU_TEST_LANES; 1: one after another).",
        "full": "The full suite: also the extended tests CI leaves out (docs/testing.md, The full suite).",
        "only": "Only these stages, comma-separated (their names as the run prints them, e.g. 'faults,fleet'); "
        "skips lint. With --full, their extended tests too.",
    }
)
def test(
    c: Context,
    fast: bool = False,
    keyword: str = "",
    scenario: str = "",
    lanes: int = 0,
    full: bool = False,
    only: str = "",
) -> None:
    """The whole suite as CI runs it: lint, unit tests, sandbox integration tests, molecule scenarios."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    if keyword:
        local.sandbox_image()
        run(c, f"pytest -q -k {shlex.quote(keyword)} tests/unit tests/integration")
        return
    if scenario and scenario not in SCENARIO_NAMES:
        raise Exit(f"--scenario: '{scenario}' is unknown; allowed: {', '.join(SCENARIO_NAMES)}", code=2)
    lanes = lanes or int(os.environ.get("MSGPU_TEST_LANES", "2"))
    if lanes < 1:
        raise Exit(f"--lanes: '{lanes}' is not allowed; allowed: 1 or more", code=2)
    if fast:
        timings["lint"] = timed(lambda: lint(c))
        timings["unit"] = run(c, "pytest -q tests/unit", what="unit tests (catalog, resolver, fixtures)")
        print(f"\nAll checks passed in {time.monotonic() - started:.0f} s.")
        return
    from testbed import fixtures, sandbox, scenarios, suite  # the containers' suite runs on the test bed

    # The unit stage's copy of the working tree: not made for one scenario alone (--scenario runs no unit test).
    unit = scenarios.unit_stages(env())[0] if not scenario else None
    early: list[suite.Stage] = []
    waiting = None
    if not scenario and not only:
        # Lint and the unit tests that need no fixture run beside the prepare step (one busy core at most:
        # downloads, one compressor at a time), one after the other; their results come with the others'.
        lint_steps = [suite.Step(what, cmd) for what, cmd in LINT_STEPS]
        early = [suite.Stage("lint", "yamllint, ansible-lint (production), ruff, site.yml syntax", lint_steps), unit]
        early_runner = suite.Runner(ROOT, RESULTS / "test-logs", env(), lanes=1)
        print(f"\nBeside the prepare step: {', '.join(s.name for s in early)} (logs in {early_runner.log_dir})")
        waiting = early_runner.start(early)
    try:
        prepare_started = time.monotonic()
        free_before_prepare = shutil.disk_usage(ROOT).free  # the caches the prepare step builds count too
        # The sandbox images (debootstraps of Ubuntu and of the unsupported Debian: about a minute each, mostly
        # the network and dpkg) build one after the other beside the fixture mirror (mostly the compressors) on a
        # fresh machine; the driver fixture, which downloads its packages in an Ubuntu container, waits for the
        # Ubuntu image under the image's lock (testbed/sandbox.py: build_image). An error of either is raised
        # before the stages start.
        try:
            sandbox.ensure_docker()  # once, before the two threads need it
        except sandbox.SandboxError as exc:
            raise Exit(f"sandbox: {exc}", code=1) from exc
        images = concurrent.futures.ThreadPoolExecutor(1)
        focal = images.submit(local.sandbox_image)
        bullseye = images.submit(local.sandbox_image, "bullseye") if not scenario else None
        sandbox.compiler_cache_dir()  # the DKMS builds' compiler cache, mounted by the scenarios (testbed/sandbox.py)
        with images, local.fixture_mirror() as group_vars:
            stage_env = {"MSGPU_SANDBOX_IMAGE": focal.result()}
            if bullseye is not None:
                bullseye.result()
            timings["prepare (images, fixtures)"] = time.monotonic() - prepare_started
            # The wheels the mirror was built from: no stage before the last reads them (testbed/fixtures.py).
            freed = fixtures.drop_wheels()
            print(f"Fixture mirror built; its source wheels deleted ({freed / 2**30:.1f} GiB freed)", flush=True)
            try:
                stages = scenarios.suite_stages(group_vars, stage_env, scenario, full)
                if only:
                    stages = scenarios.only_stages([*([unit] if unit else []), *stages], only)
            except scenarios.ScenarioError as exc:
                raise Exit(str(exc), code=1) from exc
            # Every minute: the controller's artifact cache shares disk blocks with the fixture mirror
            # (hard links of identical files; scenarios.link_cache_duplicates).
            runner = suite.Runner(ROOT, RESULTS / "test-logs", env(), lanes=lanes, tick=scenarios.link_cache_duplicates)
            what = "the full suite" if full else "without the extended tests (--full runs them)"
            print(f"\n{len(stages)} stages, {lanes} at a time, {what}; logs in {runner.log_dir}", flush=True)
            results = runner.run(stages)
    except Exception:  # Ctrl-C goes to the stages' processes too: nothing to wait for then
        if waiting is not None:
            # No orphans: the stages beside the prepare step (lint, unit) finish and report before the error.
            print("\nThe run stopped early; waiting for the stages beside the prepare step to finish.", flush=True)
            waiting()
        raise
    if waiting is not None:
        results = [*waiting(), *results]
    total = time.monotonic() - started
    report = suite.write_report(RESULTS / "test-timings.json", timings, results, runner, total, free_before_prepare)
    print("\nStage times:")
    for name, seconds in timings.items():
        print(f"  {name:<28} {seconds:7.0f} s")
    for result in results:
        steps = ", ".join(f"{k} {v:.0f} s" for k, v in result.steps.items())
        cpu = f"; controller CPU {sum(result.cpu.values()):.0f} s"
        print(f"  {result.stage:<28} {result.seconds:7.0f} s  {'ok' if result.ok else 'FAILED'}  ({steps}{cpu})")
    used = report["cpu_seconds"]
    if "machine" in used:
        inside = f", {used['containers']:.0f} of them in the containers" if "containers" in used else ""
        print(
            f"CPU while the stages ran: {used['machine']:.0f} core-seconds{inside} "
            f"({used['machine'] / max(1.0, report['stages_seconds'] * (os.cpu_count() or 1)):.0%} of "
            f"{os.cpu_count()} cores)"
        )
    if report["container_cpu_seconds"]:
        top = list(report["container_cpu_seconds"].items())[:12]
        print("  by container (sampled every 3 s): " + ", ".join(f"{name} {sec:.0f} s" for name, sec in top))
    if report["idempotent_reruns"]:
        print("\nIdempotent re-runs of site.yml (molecule's idempotence step, changed=0 wanted; beside another stage):")
        for name, rerun in report["idempotent_reruns"].items():
            goal = suite.IDEMPOTENT_GOALS.get(name)
            print(
                f"  {name:<12} {rerun['seconds']:6.1f} s  changed={rerun['changed']} ok={rerun['ok']} "
                f"skipped={rerun['skipped']}" + (f"  (goal <= {goal:.0f} s on a quiet machine)" if goal else "")
            )
    stats = sandbox.compiler_cache_stats()
    if stats:
        wanted = ("cache hit", "cache miss", "cache size")
        print("\nThe test bed's compiler cache (ccache: the DKMS builds of the scenarios and the fabric manager test):")
        print("\n".join(f"  {line}" for line in stats.splitlines() if line.startswith(wanted)))
        print(f"  conftest probes remembered          {sandbox.remembered_probes()}")
    print(
        f"Peak disk used by the run: {report['peak_disk_used_with_caches_gib']} GiB with the caches the prepare step "
        f"built (free before it {report['free_disk_before_prepare_gib']} GiB), {report['peak_disk_used_gib']} GiB by "
        f"the stages (free when they started {report['free_disk_at_start_gib']} GiB; "
        f"{report['disk_freed_by_links_gib']} GiB shared by hard links); wall time {total:.0f} s; "
        f"numbers in {RESULTS / 'test-timings.json'}"
    )
    if report["peak_disk_at"]:
        at = report["peak_disk_at"]
        beside = ", ".join(f"{name} ({seconds} s in)" for name, seconds in at["stages"].items()) or "no stage"
        print(f"  the peak came {at['seconds']} s after the stages started, while these ran: {beside}")
    failed = [r for r in results if not r.ok]
    if failed:
        raise Exit("FAILED: " + "; ".join(f"{r.stage} at {r.failed_step} (log: {r.log})" for r in failed), code=1)
    print(f"\nAll checks passed in {total:.0f} s.")
