"""The local test bed for commands run without an inventory: the sandbox host (an Ubuntu 20.04 container
without a GPU), its image, and the loopback mirror of NVIDIA fixtures.

The one seam between the operator's commands and the test bed (testbed/): cli/fleet.py and cli/dev.py reach
the test bed only through the functions here (tests/unit/test_cli_seam.py holds them to it); cli/checks.py,
the test command, runs the test bed itself. Each function imports the test bed itself, so loading this module
loads none of it: a real fleet's commands never do. The test bed's errors become the CLI's (invoke's Exit,
with the exit code).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from invoke import Exit


def sandbox_image(flavour: str = "focal") -> str:
    from testbed import sandbox

    try:
        return sandbox.build_image(flavour)
    except sandbox.SandboxError as exc:
        raise Exit(f"sandbox: {exc}", code=1) from exc


def prepare_standalone(image: str) -> None:
    """Each molecule scenario runnable alone (`molecule test -s NAME`): fixtures, group vars, image alias."""
    from testbed import fixtures, scenarios

    try:
        root = scenarios.prepare_standalone(image)
    except (fixtures.FixtureError, OSError, subprocess.CalledProcessError) as exc:
        raise Exit(f"setup: the molecule scenarios cannot run alone: {exc}", code=1) from exc
    print(f"fixture mirror: {root} (molecule serves it itself when a scenario runs alone)")


def sandbox_up(group_vars: dict | None = None) -> Path:
    """Start the sandbox host if it is not running; returns its inventory (written with `group_vars`)."""
    from testbed import sandbox
    from testbed.scenarios import SANDBOX_HOST, SANDBOX_INVENTORY

    try:
        sandbox.ensure_docker()
        if not sandbox.host_running(SANDBOX_HOST):
            sandbox.start_host(SANDBOX_HOST)
    except sandbox.SandboxError as exc:
        raise Exit(f"sandbox: {exc}", code=1) from exc
    if group_vars is None and SANDBOX_INVENTORY.is_file():
        # `sandbox up`/`shell` keep what `provision` wrote there (the fixture mirror, the expected library
        # versions the README's testinfra command needs).
        return SANDBOX_INVENTORY
    return sandbox.write_inventory(SANDBOX_INVENTORY, [SANDBOX_HOST], group_vars)


def sandbox_inventory() -> str:
    """The inventory of the local sandbox host, which must have been provisioned."""
    from testbed import sandbox
    from testbed.scenarios import SANDBOX_HOST, SANDBOX_INVENTORY

    if not (sandbox.docker_ready() and sandbox.host_running(SANDBOX_HOST) and SANDBOX_INVENTORY.exists()):
        raise Exit(f"the sandbox host {SANDBOX_HOST} is not running: run ./toolkit provision first", code=2)
    print(f"No inventory given: using the local sandbox host {SANDBOX_HOST} (no GPU).")
    return str(SANDBOX_INVENTORY)


def verify_vars() -> dict:
    """The verify settings of sandbox hosts (testbed/scenarios.py)."""
    from testbed import scenarios

    return scenarios.verify_vars()


@contextlib.contextmanager
def fixture_mirror() -> Iterator[dict]:
    """The NVIDIA fixtures served on 127.0.0.1 while the block runs; yields a sandbox host's group vars."""
    from testbed import fixtures, scenarios

    with contextlib.ExitStack() as stack:
        try:
            group_vars = stack.enter_context(scenarios.fixture_mirror())
        except fixtures.FixtureError as exc:
            raise Exit(f"fixtures: {exc}", code=1) from exc
        yield group_vars


def sandbox_host_name() -> str:
    """The container name of the local sandbox host."""
    from testbed.scenarios import SANDBOX_HOST

    return SANDBOX_HOST


def sandbox_host_action(action: str) -> str:
    """`./toolkit sandbox`: down or status of the local sandbox host; its status line."""
    from testbed import sandbox
    from testbed.scenarios import SANDBOX_HOST

    if action == "down":
        sandbox.stop_host(SANDBOX_HOST)
        return f"{SANDBOX_HOST} removed"
    running = sandbox.docker_ready() and sandbox.host_running(SANDBOX_HOST)
    return f"{SANDBOX_HOST}: {'running' if running else 'not running'}; image {sandbox.image_tag()}"


def fleet_bench(folder: Path, full: bool) -> dict:
    """The fleet benchmark on sandbox hosts (testbed/fleet_bench.py), with the fixture mirror's group vars."""
    from testbed import fixtures, fleet_bench, scenarios

    return fleet_bench.run(
        folder, full, lambda root, url: scenarios.sandbox_group_vars(root, fixtures.inventory_vars(root, url))
    )


def fetch_inventory(group_vars: dict) -> tuple[str, Path]:
    """The sandbox host's inventory for `./toolkit fetch` without an inventory (written with `group_vars`), and
    its artifact cache folder, MNIST seeded into it."""
    from testbed import sandbox, scenarios

    inventory_file = sandbox.CACHE / "fetch" / "inventory.yml"
    target = str(sandbox.write_inventory(inventory_file, [scenarios.SANDBOX_HOST], group_vars))
    folder = Path(group_vars["stack_artifact_cache_dir"])
    scenarios.seed_mnist(folder)
    return target, folder
