"""The loopback mirror's injected faults (testbed/mirror.py), which the fault tests rely on."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testbed import mirror

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture()
def served(tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "file.bin").write_bytes(PAYLOAD)
    with mirror.serving(tmp_path) as running:
        yield running


def get(served: mirror.Mirror) -> bytes:
    with urllib.request.urlopen(served.url("src/file.bin"), timeout=10) as response:
        return response.read()


def test_without_faults_the_file_is_served_whole(served):
    assert get(served) == PAYLOAD
    assert served.fetches("src/file.bin") == 1


def test_down_answers_503_every_time_until_healed(served):
    served.inject("src/file.bin", "down")
    for _ in range(3):
        with pytest.raises(urllib.error.HTTPError) as error:
            get(served)
        assert error.value.code == 503
    served.heal()
    assert get(served) == PAYLOAD
    assert served.fetches("src/file.bin") == 4


def test_truncate_cuts_the_body_after_announcing_its_length(served):
    served.inject("src/file.bin", "truncate", times=1)
    with pytest.raises(http.client.IncompleteRead) as error:
        get(served)
    assert len(error.value.partial) == len(PAYLOAD) // 2
    assert error.value.expected == len(PAYLOAD) - len(PAYLOAD) // 2
    assert get(served) == PAYLOAD  # the fault was for one request only


def test_corrupt_keeps_the_length_but_not_the_checksum(served):
    served.inject("src/file.bin", "corrupt", times=2)
    for _ in range(2):
        data = get(served)
        assert len(data) == len(PAYLOAD)
        assert hashlib.sha256(data).hexdigest() != hashlib.sha256(PAYLOAD).hexdigest()
    assert get(served) == PAYLOAD


def test_faults_queue_up_per_file(served):
    served.inject("src/file.bin", "down", times=1)
    served.inject("src/file.bin", "corrupt", times=1)
    with pytest.raises(urllib.error.HTTPError):
        get(served)
    assert get(served) != PAYLOAD
    assert get(served) == PAYLOAD


def test_unknown_faults_are_refused(served):
    with pytest.raises(ValueError, match="allowed: down, truncate, corrupt, slow"):
        served.inject("src/file.bin", "flaky")


def test_slow_serves_the_whole_file_at_a_limited_rate(served, tmp_path):
    big = tmp_path / "src" / "big.bin"
    big.write_bytes(PAYLOAD * 16)  # 16 MiB: about half a second at 32 MiB/s
    served.inject("src/big.bin", "slow", times=1)
    started = time.monotonic()
    with urllib.request.urlopen(served.url("src/big.bin"), timeout=10) as response:
        assert response.read() == PAYLOAD * 16
    # 4 chunks of 4 MiB with a pause after each: the client has the last byte after the third pause.
    assert time.monotonic() - started >= 0.3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((mirror.HOST, 0))
        return probe.getsockname()[1]


def test_ensure_serves_in_the_background_once_and_the_server_exits_when_idle(tmp_path: Path):
    """A molecule scenario run alone (molecule/common/prepare.yml): the first call starts a background mirror
    that serves the files, the second finds it answering and starts none, and it stops once idle."""
    root = tmp_path / "mirror"
    (root / "src").mkdir(parents=True)
    (root / "src" / "file.bin").write_bytes(PAYLOAD)
    url = f"http://{mirror.HOST}:{_free_port()}"
    assert not mirror.answers(url)
    started = mirror.ensure(root, url, idle_exit=6)
    pid = int(re.search(r"pid (\d+)", started).group(1))
    try:
        with urllib.request.urlopen(f"{url}/src/file.bin", timeout=10) as response:
            assert response.read() == PAYLOAD
        assert mirror.ensure(root, url, idle_exit=6) == f"{url} already answers"
        # Polling the URL would keep it busy: wait for the process (this test's child) to exit instead.
        deadline, exited = time.monotonic() + 30, False
        while not exited and time.monotonic() < deadline:
            exited = os.waitpid(pid, os.WNOHANG)[0] == pid
            time.sleep(0.5)
        assert exited, "the background mirror did not stop after 6 idle seconds"
        assert not mirror.answers(url)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_ensure_refuses_a_url_that_is_not_on_loopback_with_a_port(tmp_path: Path):
    with pytest.raises(ValueError, match=re.escape("allowed: http://127.0.0.1:PORT")):
        mirror.ensure(tmp_path, "http://example.org/mirror")
