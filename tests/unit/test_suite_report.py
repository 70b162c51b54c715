"""The suite's report reads each molecule scenario's idempotent re-run from its stage log (testbed/suite.py):
the time profile_tasks prints on the re-run's last line, and the play recap's counts. The excerpts below
are lines of a real `./toolkit test` log (molecule 26, ansible-core 2.19, profile_tasks), shortened."""

from __future__ import annotations

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
