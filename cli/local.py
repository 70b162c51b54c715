"""The local test bed for commands run without an inventory: the sandbox host (an Ubuntu 20.04 container
without a GPU), its image, and the loopback mirror of NVIDIA fixtures.

Each function imports the test bed itself, so loading this module loads none of it: a real fleet's
commands never do. The test bed's errors become the CLI's (invoke's Exit, with the exit code).
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
