"""Development commands: set up the controller tools, manage the local sandbox host (testbed/)."""

from __future__ import annotations

import os
import shlex

from invoke import Context, Exit, task

from cli import local
from cli.common import VENV_BIN, run


@task
def setup(c: Context) -> None:
    """Install the pinned controller tools into .venv, prepare the sandbox image (Docker) and the fixtures,
    so that each molecule scenario also runs alone (`.venv/bin/molecule test -s wheels`)."""
    run(c, f"{shlex.quote(str(VENV_BIN / 'pip'))} install -q -r requirements.txt", what="pip install")
    image = local.sandbox_image()
    print(f"sandbox image: {image}")
    local.prepare_standalone(image)


@task(positional=["action"], help={"action": "up | down | shell | status"})
def sandbox_host(c: Context, action: str) -> None:
    """Manage the local sandbox host (an Ubuntu 20.04 container without a GPU)."""
    name = local.sandbox_host_name()
    if action == "up":
        print(f"{name} is up; inventory: {local.sandbox_up()}")
    elif action == "shell":
        local.sandbox_up()
        os.execvp("docker", ["docker", "exec", "-it", name, "bash", "-l"])
    elif action in ("down", "status"):
        print(local.sandbox_host_action(action))
    else:
        raise Exit(f"sandbox: unknown action '{action}'; allowed: up, down, shell, status", code=2)
