"""./toolkit on a controller whose python3 is too old for the controller's tools (Ubuntu 20.04: 3.8; ansible-core
2.19 needs 3.11): it finds a newer interpreter on PATH (or MSGPU_PYTHON), or stops with the exact commands. The
script runs from a copy in a temporary folder (its own .venv to make), with stand-in interpreters on PATH."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import ROOT

TOOLS = ("bash", "sha256sum", "cut", "cat", "dirname", "basename", "id", "rm", "mkdir", "chmod", "sh")


def stand_in(folder: Path, name: str, version: str) -> Path:
    """An interpreter that answers like CPython `version` to what ./toolkit asks: the version check, --version,
    the venv module check, `-m venv DIR` (a venv whose invoke echoes its arguments) and `-m pip install`."""
    new_enough = tuple(int(x) for x in version.split(".")[:2]) >= (3, 11)
    script = f"""#!/bin/sh
case "$1 $2" in
  "--version "*) echo "Python {version}"; exit 0 ;;
  "-c import sys"*) exit {0 if new_enough else 1} ;;
  "-c import ensurepip"*) exit 0 ;;
  "-m venv") mkdir -p "$3/bin"; printf '#!/bin/sh\\nexit 0\\n' > "$3/bin/python"
             printf '#!/bin/sh\\necho "invoke $*"\\n' > "$3/bin/invoke"
             chmod +x "$3/bin/python" "$3/bin/invoke"; exit 0 ;;
esac
exit 3
"""
    path = folder / name
    path.write_text(script)
    path.chmod(0o755)
    return path


def run(tmp_path: Path, interpreters: dict[str, str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    home = tmp_path / "checkout"
    home.mkdir()
    shutil.copy(ROOT / "toolkit", home / "toolkit")
    (home / "requirements.txt").write_text("invoke==2.2.0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    for name, version in interpreters.items():
        stand_in(bin_dir, name, version)
    return subprocess.run(
        [str(bin_dir / "bash"), str(home / "toolkit"), "--list"],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), **(env or {})},
        timeout=60,
    )


def test_an_old_python3_alone_stops_with_the_commands_to_get_a_newer_one(tmp_path):
    result = run(tmp_path, {"python3": "3.8.10"})
    assert result.returncode == 2
    assert "need Python 3.11 or newer; found: Python 3.8.10." in result.stderr
    assert "sudo add-apt-repository -y ppa:deadsnakes/ppa && sudo apt-get install -y python3.11 python3.11-venv" in (
        result.stderr
    )
    assert "uv python install 3.11" in result.stderr
    assert not (tmp_path / "checkout" / ".venv").exists()


def test_a_newer_python_on_path_is_found_beside_an_old_python3(tmp_path):
    result = run(tmp_path, {"python3": "3.8.10", "python3.11": "3.11.9"})
    assert result.returncode == 0, result.stderr
    assert (
        f"installing the pinned controller tools into .venv with {tmp_path / 'bin' / 'python3.11'} (Python 3.11.9;"
        in (result.stderr)
    )
    assert result.stdout.strip() == "invoke --list"


def test_msgpu_python_names_the_interpreter_and_an_old_one_is_refused(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    stand_in(old, "py", "3.10.4")
    result = run(tmp_path, {"python3.12": "3.12.1"}, {"MSGPU_PYTHON": str(old / "py")})
    assert result.returncode == 2
    assert f"found: {old / 'py'}." in result.stderr
