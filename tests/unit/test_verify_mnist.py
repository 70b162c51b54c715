"""MNIST preparation from the real data next to the project: folder, URL over loopback, checksums, corruption."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "verify"))

from msgpu_verify import mnist

DATA = ROOT.parent / "shared" / "data" / "mnist"
LAYOUT = [
    "train/train-images-idx3-ubyte",
    "train/train-labels-idx1-ubyte",
    "test/t10k-images-idx3-ubyte",
    "test/t10k-labels-idx1-ubyte",
]


@pytest.fixture(scope="module")
def sums() -> dict:
    return mnist.parse_sha256sums((DATA / "SHA256SUMS").read_text())


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, sums) -> Path:
    dest = tmp_path_factory.mktemp("mnist") / "MNIST"
    assert mnist.prepare(str(DATA), str(dest), sums) == dest
    return dest


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server (127.0.0.1, port 0) serving a copy of the gz files."""
    root = tmp_path / "www"
    shutil.copytree(DATA, root)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_folder_of_gz_files_gives_the_layout(prepared):
    for relative in LAYOUT:
        path = prepared / relative
        assert path.is_file()
    assert (prepared / LAYOUT[0]).stat().st_size == 16 + 60000 * 784
    assert (prepared / LAYOUT[3]).stat().st_size == 8 + 10000
    assert mnist.is_complete(prepared)


def test_second_call_is_idempotent(prepared, sums):
    before = {relative: (prepared / relative).stat().st_mtime_ns for relative in LAYOUT}
    mnist.prepare(str(DATA), str(prepared), sums)
    assert before == {relative: (prepared / relative).stat().st_mtime_ns for relative in LAYOUT}


def test_prepared_layout_is_itself_a_valid_source(prepared, tmp_path):
    dest = mnist.prepare(str(prepared), str(tmp_path / "again"))
    assert mnist.is_complete(dest)


def test_checksum_mismatch_names_the_file(tmp_path, sums):
    wrong = dict(sums)
    wrong["train-labels-idx1-ubyte.gz"] = "0" * 64
    with pytest.raises(mnist.MnistError) as caught:
        mnist.prepare(str(DATA), str(tmp_path / "dest"), wrong)
    message = str(caught.value)
    assert "train-labels-idx1-ubyte.gz" in message
    assert "0" * 64 in message
    assert sums["train-labels-idx1-ubyte.gz"] in message
    assert not (tmp_path / "dest" / "train" / "train-labels-idx1-ubyte").exists()


def test_corrupted_file_is_refused(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(DATA, source)
    # A valid gzip whose content has the wrong IDX magic number.
    raw = bytearray(gzip.decompress((source / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    raw[3] = 0x03
    (source / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(mnist.MnistError, match="t10k-labels-idx1-ubyte: bad IDX magic"):
        mnist.prepare(str(source), str(tmp_path / "dest"))
    # A truncated gzip.
    data = (DATA / "t10k-images-idx3-ubyte.gz").read_bytes()
    (source / "t10k-labels-idx1-ubyte.gz").write_bytes((DATA / "t10k-labels-idx1-ubyte.gz").read_bytes())
    (source / "t10k-images-idx3-ubyte.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(mnist.MnistError, match="t10k-images-idx3-ubyte"):
        mnist.prepare(str(source), str(tmp_path / "dest2"))
    assert not (tmp_path / "dest2" / "test" / "t10k-images-idx3-ubyte").exists()
    assert not list((tmp_path / "dest2" / "test").iterdir())  # no temp file left behind


def test_download_over_loopback_http(server, sums, tmp_path):
    _root, url = server
    dest = mnist.prepare(url, str(tmp_path / "dest"), sums, timeout_s=10, retries=1)
    assert mnist.is_complete(dest)
    assert not (dest / ".download").exists()


def test_download_with_a_bad_checksum_is_refused(server, sums, tmp_path):
    root, url = server
    (root / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not the file")
    with pytest.raises(mnist.MnistError) as caught:
        mnist.prepare(url, str(tmp_path / "dest"), sums, timeout_s=10, retries=1)
    assert "checksum mismatch for t10k-labels-idx1-ubyte.gz" in str(caught.value)
    assert sums["t10k-labels-idx1-ubyte.gz"] in str(caught.value)
    assert not list((tmp_path / "dest" / ".download").glob("t10k-labels*"))


def test_download_needs_checksums(server, tmp_path):
    _root, url = server
    with pytest.raises(mnist.MnistError, match="no sha256"):
        mnist.prepare(url, str(tmp_path / "dest"), {})


def test_cli_reports_changed_then_unchanged(tmp_path):
    command = [
        sys.executable, "-m", "msgpu_verify", "mnist", "--source", str(DATA),
        "--sha256-file", str(DATA / "SHA256SUMS"), "--dest", str(tmp_path / "dest"),
    ]
    env = {"PYTHONPATH": str(ROOT / "verify"), "PATH": "/usr/bin:/bin"}
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"ok": True, "changed": True, "dest": str(tmp_path / "dest")}
    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert json.loads(second.stdout)["changed"] is False
    bad = subprocess.run([*command[:-1], str(tmp_path / "other"), "--sha256", "t10k-images-idx3-ubyte.gz=" + "1" * 64],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1
    assert "t10k-images-idx3-ubyte.gz" in json.loads(bad.stdout)["error"]
