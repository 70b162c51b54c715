"""`./toolkit test` (cli/checks.py): when the prepare step fails, the stages it started beside it (lint, unit)
finish before the error reaches the user, so no test process is left running behind the failed command. The
stages here are stand-ins (a short sleep that leaves a file when it ends); the prepare step's image build fails
(the fixture mirror, which builds beside the images, is a stand-in too)."""

from __future__ import annotations

import contextlib

import pytest
from invoke import Context

from cli import checks, local
from testbed import sandbox, scenarios, suite


def test_a_failed_prepare_step_waits_for_the_stages_beside_it(tmp_path, monkeypatch):
    done = tmp_path / "unit-finished"
    unit = suite.Stage("unit", "stand-in", [suite.Step("unit", f"sleep 1 && touch {done}")])
    monkeypatch.setattr(scenarios, "unit_stages", lambda env: (unit, unit))
    monkeypatch.setattr(checks, "LINT_STEPS", (("lint", "true"),))
    monkeypatch.setattr(checks, "RESULTS", tmp_path)

    def broken(flavour: str = "focal") -> str:
        raise RuntimeError("debootstrap failed")

    @contextlib.contextmanager
    def no_mirror():
        yield {}

    monkeypatch.setattr(local, "sandbox_image", broken)
    monkeypatch.setattr(local, "fixture_mirror", no_mirror)
    monkeypatch.setattr(sandbox, "ensure_docker", lambda: None)
    with pytest.raises(RuntimeError, match="debootstrap failed"):
        checks.test.body(Context())
    assert done.exists(), "the unit stage was still running when the command returned"
