"""MNIST from the catalog's sources in order, with the repository's own copy (data/mnist) last.

Real data only: the repository's copy, served over loopback HTTP where a mirror is needed. Covers the
layout, checksums (a mirror's .gz by its published sha256, any other gzip of the same data by its
content), corruption, the order of the sources, an unreachable source given up at once (a name that
does not resolve, a closed loopback port) with a message naming the two settings that fix it, retries
only for a transfer that breaks off, offline runs, and the verify role's controller step through
ansible-playbook.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from msgpu_verify import mnist

from tests.conftest import ROOT, load_module

# The resolver, which publishes MNIST's sources and sums (stack_resolved.mnist) for the verify role.
STACK_CATALOG = load_module("stack_catalog_for_mnist", ROOT / "roles" / "stack" / "filter_plugins" / "stack_catalog.py")

# The copy inside this repository: what the unit tests read, and the catalog's last MNIST source.
DATA = ROOT / "data" / "mnist"
LAYOUT = [
    "train/train-images-idx3-ubyte",
    "train/train-labels-idx1-ubyte",
    "test/t10k-images-idx3-ubyte",
    "test/t10k-labels-idx1-ubyte",
]
GZ = [name + ".gz" for name in mnist.FILES]
UNRESOLVABLE = "http://mnist.invalid/mnist"  # .invalid never resolves (RFC 2606)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def closed_port() -> int:
    """A loopback port nobody listens on: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def lookup_seconds(host: str) -> float:
    """What one failed name lookup costs on this machine (the floor of a fast failure)."""
    started = time.monotonic()
    with pytest.raises(OSError):
        socket.getaddrinfo(host, 80)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def sums() -> dict:
    """The repository copy's own checksums (its .gz files)."""
    return mnist.parse_sha256sums((DATA / "SHA256SUMS").read_text())


@pytest.fixture(scope="module")
def pins(catalog) -> dict:
    """What the verify role pins: the mirrors' published .gz files and the decompressed content."""
    return {**catalog["mnist"]["published"], **catalog["mnist"]["idx"]}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, sums) -> Path:
    dest = tmp_path_factory.mktemp("mnist") / "MNIST"
    assert mnist.prepare(str(DATA), str(dest), sums) == dest
    return dest


class Mirror:
    """A loopback HTTP server over a folder; records each path asked for; can break a transfer off."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        self.break_off: dict[str, int] = {}  # file name -> how many transfers to cut short
        mirror = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                mirror.requests.append(name)
                if mirror.break_off.get(name, 0) > 0:
                    mirror.break_off[name] -= 1
                    body = (mirror.root / name).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 3])  # then the connection closes
                    self.close_connection = True
                    return
                super().do_GET()

            def log_message(self, *args) -> None:
                pass

        handler = functools.partial(Handler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def mirrors(tmp_path):
    """Two loopback mirrors, each serving its own copy of the repository's .gz files."""
    started = []
    for label in ("first", "second"):
        root = tmp_path / label
        shutil.copytree(DATA, root)
        started.append(Mirror(root))
    yield started
    for mirror in started:
        mirror.close()


# --- the repository's copy and the catalog ---------------------------------------------------------
def test_repository_copy_matches_the_catalog(catalog, sums):
    entry = catalog["mnist"]
    assert entry["repository_copy"] == "data/mnist"
    assert (ROOT / entry["repository_copy"]).resolve() == DATA.resolve()
    on_disk = {name: sha256((DATA / name).read_bytes()) for name in GZ}
    assert on_disk == entry["files"] == sums
    content = {name: sha256(gzip.decompress((DATA / (name + ".gz")).read_bytes())) for name in mnist.FILES}
    assert content == entry["idx"]
    # The published .gz files differ from the copy's (gzipped again), so both are pinned.
    assert set(entry["published"]) == set(GZ)
    assert not set(entry["published"].values()) & set(entry["files"].values())
    readme = (DATA / "README.md").read_text()
    assert "CC BY-SA 3.0" in readme and "LeCun" in readme and "Cortes" in readme
    assert all(value in readme for value in [*entry["files"].values(), *entry["idx"].values()])


def test_catalog_lists_the_mirrors_in_order(catalog):
    entry = catalog["mnist"]
    assert entry["sources"][0] == entry["source"] == "mnist"  # the official mirror first
    assert len(entry["sources"]) >= 2
    for name in entry["sources"]:
        assert catalog["sources"][name].startswith("https://"), name


def test_nothing_reads_the_data_beside_the_checkout():
    """The project's own files never need the folder beside the checkout (a clone anywhere else has none)."""
    beside = "/".join(("..", "shared"))  # spelled in pieces so this file does not name it itself
    offenders = []
    for folder in ("tasks.py", "cli", "tests", "testbed", "roles", "verify", "playbooks", "catalog"):
        for path in [ROOT / folder] if folder.endswith(".py") else (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yml", ".yaml", ".j2", ".md") and path != Path(__file__):
                text = path.read_text(errors="replace")
                if beside in text or any(f"{a}{b}" in text for a, b in (('"shared"', " /"), ("/ ", '"shared"'))):
                    offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders


# --- the layout and checksums ------------------------------------------------------------------------------
def test_folder_of_gz_files_gives_the_layout(prepared):
    for relative in LAYOUT:
        assert (prepared / relative).is_file()
    assert (prepared / LAYOUT[0]).stat().st_size == 16 + 60000 * 784
    assert (prepared / LAYOUT[3]).stat().st_size == 8 + 10000
    assert mnist.is_complete(prepared)


def test_second_call_is_idempotent(prepared, sums):
    before = {relative: (prepared / relative).stat().st_mtime_ns for relative in LAYOUT}
    mnist.prepare(str(DATA), str(prepared), sums)
    assert before == {relative: (prepared / relative).stat().st_mtime_ns for relative in LAYOUT}


def test_prepared_layout_is_itself_a_valid_source(prepared, tmp_path, pins):
    dest = mnist.prepare(str(prepared), str(tmp_path / "again"), pins)
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


def test_any_gzip_of_the_same_data_passes_by_its_content(tmp_path, pins):
    """A mirror's .gz is pinned as published; another gzip of the same IDX data passes by its content,
    changed content never does."""
    source = tmp_path / "regzipped"
    source.mkdir()
    for name in GZ:
        (source / name).write_bytes(gzip.compress(gzip.decompress((DATA / name).read_bytes()), compresslevel=1))
    assert mnist.is_complete(mnist.prepare(str(source), str(tmp_path / "ok"), pins))
    raw = bytearray(gzip.decompress((DATA / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    raw[-1] = (raw[-1] + 1) % 10  # one label changed: still a valid IDX file
    (source / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(mnist.MnistError) as caught:
        mnist.prepare(str(source), str(tmp_path / "changed"), pins)
    message = str(caught.value)
    assert "checksum mismatch for t10k-labels-idx1-ubyte.gz" in message
    assert pins["t10k-labels-idx1-ubyte"] in message and pins["t10k-labels-idx1-ubyte.gz"] in message


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


# --- downloads, sources in order ------------------------------------------------------------------------
def test_download_over_loopback_http(mirrors, sums, tmp_path):
    dest = mnist.prepare(mirrors[0].url, str(tmp_path / "dest"), sums, timeout_s=10, retries=1)
    assert mnist.is_complete(dest)
    assert not (dest / ".download").exists()


def test_download_with_a_bad_checksum_is_refused(mirrors, sums, tmp_path):
    (mirrors[0].root / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not the file")
    with pytest.raises(mnist.MnistError) as caught:
        mnist.prepare(mirrors[0].url, str(tmp_path / "dest"), sums, timeout_s=10, retries=1)
    assert "checksum mismatch for t10k-labels-idx1-ubyte.gz" in str(caught.value)
    assert sums["t10k-labels-idx1-ubyte.gz"] in str(caught.value)
    assert not list((tmp_path / "dest" / ".download").glob("t10k-labels*"))


def test_download_needs_checksums(mirrors, tmp_path):
    with pytest.raises(mnist.MnistError, match="no sha256"):
        mnist.prepare(mirrors[0].url, str(tmp_path / "dest"), {})


def test_the_first_source_that_has_a_file_gives_it(mirrors, sums, tmp_path):
    first, second = mirrors
    (first.root / "train-labels-idx1-ubyte.gz").unlink()  # a 404 on the first mirror: the second has it
    result = mnist.fetch([first.url, second.url, str(DATA)], str(tmp_path / "cache"), sums, timeout_s=10)
    assert result["fetched"] == {
        "train-images-idx3-ubyte.gz": first.url,
        "train-labels-idx1-ubyte.gz": second.url,
        "t10k-images-idx3-ubyte.gz": first.url,
        "t10k-labels-idx1-ubyte.gz": first.url,
    }
    assert first.requests == GZ  # each file asked once, the 404 not retried
    assert second.requests == ["train-labels-idx1-ubyte.gz"]
    assert "HTTP 404" in result["passed_over"][first.url]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(GZ)
    # Filled: a second run asks nobody.
    again = mnist.fetch([first.url, second.url], str(tmp_path / "cache"), sums, timeout_s=10)
    assert again["changed"] is False and first.requests == GZ


def test_unreachable_sources_are_given_up_at_once_then_the_repository_copy(tmp_path, pins):
    """The scenario of issue 14: no internet. Both mirrors fail in about one name lookup each (no retries,
    no delays), and the repository's copy, the last source, fills the cache."""
    refused = f"http://127.0.0.1:{closed_port()}/mnist"
    floor = lookup_seconds("mnist.invalid")
    started = time.monotonic()
    result = mnist.fetch([UNRESOLVABLE, refused, str(DATA)], str(tmp_path / "cache"), pins, retries=3)
    seconds = time.monotonic() - started
    print(f"two unreachable mirrors, then the repository's copy: {seconds:.2f} s (one failed lookup: {floor:.2f} s)")
    assert set(result["fetched"].values()) == {str(DATA)}
    assert "does not resolve" in result["passed_over"][UNRESOLVABLE]
    assert "refused" in result["passed_over"][refused]
    # Each unreachable mirror is tried for the first file only, then skipped: one lookup, not 4 x retries.
    assert seconds < 3 * floor + 5, seconds


def test_no_reachable_source_fails_in_seconds_naming_the_fixes(tmp_path, pins):
    refused = f"http://127.0.0.1:{closed_port()}/mnist"
    floor = lookup_seconds("mnist.invalid")
    started = time.monotonic()
    with pytest.raises(mnist.MnistError) as caught:
        mnist.prepare([UNRESOLVABLE, refused], str(tmp_path / "dest"), pins, retries=3)
    seconds = time.monotonic() - started
    print(f"unreachable upstream failed after {seconds:.2f} s (one failed lookup: {floor:.2f} s)")
    assert seconds < 2 * floor + 5, seconds  # 3 retries with delays would take far longer
    message = str(caught.value)
    assert message.index(UNRESOLVABLE) < message.index(refused)  # in the order tried
    assert "does not resolve" in message and "connection was refused" in message
    assert "stack_sources.mnist" in message and "verify_mnist_local_path" in message
    assert "data/mnist" in message
    assert not (tmp_path / "dest" / ".download").exists()


def test_a_transfer_that_breaks_off_is_tried_again(mirrors, sums, tmp_path):
    first = mirrors[0]
    first.break_off["t10k-images-idx3-ubyte.gz"] = 1
    dest = mnist.prepare(first.url, str(tmp_path / "dest"), sums, timeout_s=10, retries=2)
    assert mnist.is_complete(dest)
    assert first.requests.count("t10k-images-idx3-ubyte.gz") == 2
    # Out of tries: the next source is asked.
    first.break_off["t10k-images-idx3-ubyte.gz"] = 5
    result = mnist.fetch([first.url, str(DATA)], str(tmp_path / "cache"), sums, timeout_s=10, retries=2)
    assert result["fetched"]["t10k-images-idx3-ubyte.gz"] == str(DATA)
    assert "failed 2 times" in result["passed_over"][first.url]


def test_offline_uses_local_folders_only(mirrors, pins, tmp_path):
    result = mnist.fetch([mirrors[0].url, DATA.as_uri()], str(tmp_path / "cache"), pins, offline=True)
    assert mirrors[0].requests == []
    assert set(result["fetched"].values()) == {DATA.as_uri()}


def test_a_bad_file_in_the_cache_is_fetched_again(tmp_path, pins):
    cache = tmp_path / "cache"
    mnist.fetch([str(DATA)], str(cache), pins)
    (cache / "train-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    (cache / "train-labels-idx1-ubyte").write_bytes(b"a second copy")
    result = mnist.fetch([str(DATA)], str(cache), pins)
    assert result["fetched"] == {"train-labels-idx1-ubyte.gz": str(DATA)}
    assert sorted(p.name for p in cache.iterdir()) == sorted(GZ)


# --- command lines ---------------------------------------------------------------------------------------
def run_module(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT / "verify"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_reports_changed_then_unchanged(tmp_path):
    command = ["-m", "msgpu_verify", "mnist", "--source", str(DATA), "--sha256-file", str(DATA / "SHA256SUMS")]
    first = run_module(*command, "--dest", str(tmp_path / "dest"))
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"ok": True, "changed": True, "dest": str(tmp_path / "dest")}
    second = run_module(*command, "--dest", str(tmp_path / "dest"))
    assert json.loads(second.stdout)["changed"] is False
    bad = run_module(*command, "--dest", str(tmp_path / "other"), "--sha256", "t10k-images-idx3-ubyte.gz=" + "1" * 64)
    assert bad.returncode == 1
    assert "t10k-images-idx3-ubyte.gz" in json.loads(bad.stdout)["error"]


def test_cli_tries_the_sources_in_order(tmp_path, pins):
    sums = [f"--sha256={name}={value}" for name, value in pins.items()]
    refused = f"http://127.0.0.1:{closed_port()}/mnist"
    sources = [f"--source={UNRESOLVABLE}", f"--source={refused}"]
    done = run_module(
        "-m", "msgpu_verify.mnist", "prepare", *sources, f"--source={DATA}", *sums, "--dest", str(tmp_path / "dest")
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "changed": True, "dest": str(tmp_path / "dest")}
    failed = run_module("-m", "msgpu_verify.mnist", "fetch", *sources, *sums, "--dest", str(tmp_path / "cache"))
    assert failed.returncode == 1
    document = json.loads(failed.stdout)
    assert document["ok"] is False and "stack_sources.mnist" in document["error"]
    assert failed.stderr.startswith("mnist: ERROR after"), failed.stderr


# --- the verify role's controller step (roles/verify/tasks/mnist.yml) through ansible-playbook -------------
PLAY = """\
- name: MNIST into the controller's cache, as roles/verify does before copying it to the hosts
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The verify role's MNIST step
      ansible.builtin.include_role:
        name: verify
        tasks_from: mnist
"""


def role_step(
    tmp_path: Path, sources: dict, catalog: dict | None = None, **extra
) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "play.yml").write_text(PLAY)
    catalog = catalog or yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
    resolved = STACK_CATALOG.resolve_stack(catalog, {"sources": sources})["stack"]
    variables = {
        "stack_resolved": {
            "sources": resolved["sources"],
            "mnist": {**resolved["mnist"], "cache_dir": str(tmp_path / "cache")},
            "artifact_cache": {"offline": False},
        },
        "verify_source_dir": str(ROOT / "verify"),
        "ansible_python_interpreter": sys.executable,
        **extra,
    }
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    command = [str(Path(sys.prefix) / "bin" / "ansible-playbook"), "-i", "localhost,", str(tmp_path / "play.yml")]
    started = time.monotonic()
    run = subprocess.run(
        [*command, "-e", json.dumps(variables)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    return run, time.monotonic() - started


def test_role_fills_the_cache_from_the_repository_copy_when_the_mirrors_are_unreachable(tmp_path):
    unreachable = {"mnist": UNRESOLVABLE, "mnist_ossci": f"http://127.0.0.1:{closed_port()}/mnist"}
    run, seconds = role_step(tmp_path, unreachable)
    print(f"verify role, MNIST step with both mirrors unreachable: {seconds:.1f} s (ansible-playbook included)")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(GZ)
    assert seconds < 60, seconds


def test_role_fails_in_seconds_naming_the_fixes(tmp_path):
    """Without the repository's copy (a catalog that has none), unreachable mirrors fail the step at once."""
    catalog = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
    del catalog["mnist"]["repository_copy"]
    unreachable = {"mnist": UNRESOLVABLE, "mnist_ossci": f"http://127.0.0.1:{closed_port()}/mnist"}
    run, seconds = role_step(tmp_path, unreachable, catalog)
    print(f"verify role, MNIST step with no reachable source: failed after {seconds:.1f} s (ansible-playbook included)")
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert "MNIST could not be fetched" in output, output[-3000:]
    for needle in ("mnist.invalid", "connection was refused", "stack_sources.mnist", "verify_mnist_local_path"):
        assert needle in output, needle
    assert seconds < 60, seconds


def test_cli_refuses_numbers_out_of_range(tmp_path):
    for flag, value in (("--retries", "101"), ("--timeout", "0"), ("--connect-timeout", "abc")):
        run = run_module("-m", "msgpu_verify.mnist", "fetch", f"--source={DATA}", "--dest", str(tmp_path), flag, value)
        assert run.returncode == 2 and f"{flag} {value!r}: allowed is" in run.stderr, run.stderr
