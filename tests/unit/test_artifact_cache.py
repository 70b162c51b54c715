"""The controller's artifact cache: the filler (roles/artifacts/files/artifact_cache.py) against a real
loopback mirror with injected faults, the resolver's side (stack_catalog.py: `apply_cache`) and the cache's
filters (roles/artifacts/filter_plugins: `cache_manifest`, `cache_wheelhouses`, `cache_components`) that tell it
what to fetch."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from testbed import mirror
from tests.conftest import ROOT, controller_playbook, load_module

# The cache's filters (what a run fetches), owned by the artifacts role.
CACHE_FILTERS = load_module("artifacts_cache", ROOT / "roles" / "artifacts" / "filter_plugins" / "artifacts_cache.py")

FILLER = ROOT / "roles" / "artifacts" / "files" / "artifact_cache.py"
MEMO = ".sha256-memo.json"  # the filler's record of the sha256s it read (artifact_cache.MEMO)
RETRIES = 2  # every failing file is asked for 1 + RETRIES times
RUNFILE = "cuda_11.1.0_455.23.05_linux.run"
TARBALL = "cudnn-11.1-linux-x64-v8.0.5.39.tgz"
WHEEL = "mindspore_gpu-1.5.1-cp38-cp38-manylinux1_x86_64.whl"
NCCL_WHEEL = "nvidia_nccl_cu11-2.14.3-py3-none-manylinux1_x86_64.whl"  # the default stack's NCCL


def package_of(wheel: str) -> str:
    """The PyPI project of one of the default stack's wheels (mindspore_gpu-..., nvidia_nccl_cu11-...)."""
    return {"mindspore_gpu": "mindspore-gpu", "nvidia_nccl_cu11": "nvidia-nccl-cu11"}[wheel.split("-", 1)[0]]


PAYLOADS = {
    RUNFILE: bytes(range(256)) * 1024,  # 256 KiB: big enough that "truncate" cuts real data
    TARBALL: b"cudnn tarball " * 4096,
    WHEEL: b"PK wheel " * 8192,
}
ALL_COMPONENTS = ["nvidia_driver", "cuda", "cudnn", "nccl", "tensorrt", "mindspore"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_files(cache: Path) -> list[str]:
    """Everything in the cache apart from the filler's lock and progress log."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.name not in (".lock", ".fetch.log", MEMO))


def pep503_page(*links: str) -> str:
    anchors = "\n".join(f'<a href="{href}">{text}</a><br/>' for text, href in links)
    return f"<!DOCTYPE html>\n<html><body><h1>Links for mindspore-gpu</h1>\n{anchors}\n</body></html>\n"


# --- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def filler_module():
    return load_module("artifact_cache", FILLER)


@pytest.fixture
def filler(filler_module, monkeypatch):
    """The filler with no progress log: main() sets one for the process, monkeypatch undoes it."""
    monkeypatch.setattr(filler_module, "PROGRESS_LOG", None)
    return filler_module


@pytest.fixture
def served(tmp_path: Path):
    """A mirror with the files under files/ and a PEP 503 index under simple/ that lists the wheel
    by a relative link with its sha256 fragment, as PyPI does."""
    root = tmp_path / "mirror"
    (root / "files").mkdir(parents=True)
    for name, data in PAYLOADS.items():
        (root / "files" / name).write_bytes(data)
    page = root / "simple" / "mindspore-gpu" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(pep503_page((WHEEL, f"../../files/{WHEEL}#sha256={sha256(PAYLOADS[WHEEL])}")))
    with mirror.serving(root) as running:
        yield running


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def url_entry(served: mirror.Mirror, name: str = RUNFILE, component: str = "cuda") -> dict[str, Any]:
    return {
        "component": component,
        "file": name,
        "dest": name,
        "sha256": sha256(PAYLOADS[name]),
        "url": served.url(f"files/{name}"),
    }


def index_entry(served: mirror.Mirror, name: str = WHEEL, package: str = "MindSpore_GPU") -> dict[str, Any]:
    return {
        "component": "mindspore",
        "file": name,
        "dest": name,
        "sha256": sha256(PAYLOADS.get(name, b"")),
        "index_url": served.url("simple"),
        "package": package,
    }


def fill(filler, manifest: list[dict[str, Any]], cache: Path, offline: bool = False) -> dict[str, Any]:
    return filler.fill(manifest, cache, offline, RETRIES, 0.0, 10.0)


# --- fill(): fetch once, keep, re-fetch only what is wrong ----------------------------------------
def test_a_file_is_fetched_once_then_found_in_the_cache(filler, served, cache):
    entry = url_entry(served)
    first = fill(filler, [entry], cache)
    assert first["ok"] is True
    assert [f["file"] for f in first["fetched"]] == [RUNFILE]
    assert first["fetched"][0]["url"] == served.url(f"files/{RUNFILE}")
    assert first["bytes_fetched"] == len(PAYLOADS[RUNFILE])
    assert (cache / RUNFILE).read_bytes() == PAYLOADS[RUNFILE]
    assert (cache / RUNFILE).stat().st_mode & 0o777 == 0o644
    assert served.fetches(f"files/{RUNFILE}") == 1

    second = fill(filler, [entry], cache)
    assert second["ok"] is True
    assert (second["present"], second["fetched"], second["bytes_fetched"]) == ([RUNFILE], [], 0)
    assert served.fetches(f"files/{RUNFILE}") == 1
    assert cache_files(cache) == [RUNFILE]


def test_a_cached_file_with_a_wrong_checksum_is_fetched_again(filler, served, cache):
    cache.mkdir()
    (cache / RUNFILE).write_bytes(b"an old or damaged copy")
    result = fill(filler, [url_entry(served)], cache)
    assert result["present"] == []
    assert [f["file"] for f in result["fetched"]] == [RUNFILE]
    assert (cache / RUNFILE).read_bytes() == PAYLOADS[RUNFILE]
    assert served.fetches(f"files/{RUNFILE}") == 1


def test_an_unchanged_cache_file_is_not_read_again_a_rewritten_one_is(
    filler, filler_module, served, cache, monkeypatch
):
    """Which files are present is asked on every run: a file unchanged since its sha256 was read (size, mtime,
    inode) is not hashed again; one written since, even in place with the same size, is."""
    entry = url_entry(served)
    assert fill(filler, [entry], cache)["ok"] is True
    reads: list[str] = []
    real = filler_module.sha256_of
    monkeypatch.setattr(filler_module, "sha256_of", lambda path: reads.append(Path(path).name) or real(path))
    assert fill(filler, [entry], cache, offline=True)["present"] == [RUNFILE]
    assert reads == []  # the download verified it; the memo knows it
    damaged = bytearray(PAYLOADS[RUNFILE])
    damaged[0] ^= 0xFF
    (cache / RUNFILE).write_bytes(bytes(damaged))  # in place: same inode and size, a new mtime
    result = fill(filler, [entry], cache, offline=True)
    assert reads == [RUNFILE]
    assert result["present"] == [] and [m["file"] for m in result["missing"]] == [RUNFILE]
    assert fill(filler, [entry], cache)["fetched"][0]["file"] == RUNFILE


def test_offline_lists_what_is_missing_and_fetches_nothing(filler, served, cache):
    cache.mkdir()
    (cache / TARBALL).write_bytes(PAYLOADS[TARBALL])
    manifest = [url_entry(served), url_entry(served, TARBALL, "cudnn"), index_entry(served)]
    result = fill(filler, manifest, cache, offline=True)

    assert result["ok"] is False
    assert result["present"] == [TARBALL]
    assert result["fetched"] == [] and result["failed"] == []
    assert result["missing"] == [
        {"file": RUNFILE, "component": "cuda", "from": served.url(f"files/{RUNFILE}")},
        {"file": WHEEL, "component": "mindspore", "from": f"MindSpore_GPU on the pip index {served.url('simple')}"},
    ]
    assert served.counts == {}
    assert cache_files(cache) == [TARBALL]

    message = filler.explain(result, True)
    assert "stack_offline is true and 2 file(s) are not in the artifact cache" in message
    assert str(cache) in message and "stack_artifact_cache_dir" in message
    assert f"{RUNFILE} (cuda), from {served.url(f'files/{RUNFILE}')}" in message
    assert f"{WHEEL} (mindspore), from MindSpore_GPU on the pip index {served.url('simple')}" in message
    assert "./toolkit fetch" in message


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("corrupt", re.compile(r"its sha256 is [0-9a-f]{64}, the catalog pins " + sha256(PAYLOADS[RUNFILE]))),
        ("truncate", re.compile(rf"the connection closed after {len(PAYLOADS[RUNFILE]) // 2} of ")),
        ("down", re.compile(r"HTTP Error 503")),
    ],
    ids=["corrupt", "truncate", "down"],
)
def test_a_failing_download_is_retried_then_reported_and_leaves_nothing(filler, served, cache, fault, reason):
    served.inject(f"files/{RUNFILE}", fault)
    result = fill(filler, [url_entry(served)], cache)

    assert served.fetches(f"files/{RUNFILE}") == 1 + RETRIES
    assert result["ok"] is False
    assert result["fetched"] == [] and result["missing"] == []
    [failure] = result["failed"]
    assert (failure["file"], failure["component"]) == (RUNFILE, "cuda")
    assert failure["error"].startswith(f"{RUNFILE} (cuda) from {served.url(f'files/{RUNFILE}')}: ")
    assert reason.search(failure["error"]), failure["error"]
    assert cache_files(cache) == []  # neither the file nor a *.part
    assert filler.explain(result, False) == f"could not fetch {failure['error']}"


def test_a_fault_that_passes_within_the_retries_still_fills_the_cache(filler, served, cache):
    served.inject(f"files/{RUNFILE}", "truncate", times=1)
    served.inject(f"files/{RUNFILE}", "corrupt", times=1)
    result = fill(filler, [url_entry(served)], cache)
    assert result["ok"] is True
    assert served.fetches(f"files/{RUNFILE}") == 3
    assert (cache / RUNFILE).read_bytes() == PAYLOADS[RUNFILE]
    assert cache_files(cache) == [RUNFILE]


def test_one_failing_file_does_not_stop_the_others(filler, served, cache):
    served.inject(f"files/{RUNFILE}", "down")
    result = fill(filler, [url_entry(served), url_entry(served, TARBALL, "cudnn")], cache)
    assert [f["file"] for f in result["failed"]] == [RUNFILE]
    assert [f["file"] for f in result["fetched"]] == [TARBALL]
    assert cache_files(cache) == [TARBALL]


def test_a_file_in_a_subfolder_is_placed_there(filler, served, cache):
    entry = dict(url_entry(served, TARBALL, "mnist"), dest=f"mnist/{TARBALL}")
    assert fill(filler, [entry], cache)["ok"] is True
    assert (cache / "mnist" / TARBALL).read_bytes() == PAYLOADS[TARBALL]


# --- fill() from a pip index (PEP 503) ---------------------------------------------------------
# SimpleHTTPRequestHandler answers a folder URL ending in "/" with the folder's index.html, so the
# mirror serves <index>/<normalized-name>/ exactly as a PEP 503 index does.
def test_wheel_url_reads_the_link_from_the_index_page(filler, served):
    url = filler.wheel_url(served.url("simple"), "MindSpore_GPU", WHEEL, 10.0)
    assert url == served.url(f"files/{WHEEL}")  # relative link resolved, #sha256 fragment dropped
    assert served.fetches("simple/mindspore-gpu/") == 1


def test_a_wheel_is_fetched_through_the_index(filler, served, cache):
    result = fill(filler, [index_entry(served)], cache)
    assert result["ok"] is True
    assert result["fetched"][0]["url"] == served.url(f"files/{WHEEL}")
    assert (cache / WHEEL).read_bytes() == PAYLOADS[WHEEL]
    assert served.fetches("simple/mindspore-gpu/") == 1
    assert served.fetches(f"files/{WHEEL}") == 1


def test_a_wheel_not_on_the_index_page_is_a_clear_error(filler, served, cache):
    with pytest.raises(filler.FetchError) as error:
        filler.wheel_url(served.url("simple"), "mindspore-gpu", "mindspore_gpu-9.9-cp38.whl", 10.0)
    assert str(error.value) == f"mindspore_gpu-9.9-cp38.whl is not listed on {served.url('simple/mindspore-gpu/')}"

    result = fill(filler, [index_entry(served, name="mindspore_gpu-9.9-cp38.whl")], cache)
    [failure] = result["failed"]
    assert f"is not listed on {served.url('simple/mindspore-gpu/')}" in failure["error"]
    assert "on the pip index" in failure["error"]
    assert served.fetches("simple/mindspore-gpu/") == 1 + (1 + RETRIES)  # wheel_url above, then each try
    assert cache_files(cache) == []


def test_a_package_missing_from_the_index_is_reported(filler, served, cache):
    result = fill(filler, [index_entry(served, package="mindspore")], cache)
    [failure] = result["failed"]
    assert failure["error"].endswith("HTTP Error 404: File not found")
    assert cache_files(cache) == []


@pytest.fixture
def chunked_cut_server():
    """A server that answers with chunked transfer encoding and closes the connection in the middle
    of the first chunk, as a proxy that streams a download and drops it does. The loopback mirror
    cannot do this (it always sends a Content-Length)."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                requests.append(connection.recv(65536))
                connection.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + b"x" * 100)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", requests
    listener.close()
    thread.join(timeout=5)


def test_a_chunked_download_cut_midway_is_retried_and_reported(filler, cache, chunked_cut_server):
    base_url, requests = chunked_cut_server
    entry = {"component": "cuda", "file": RUNFILE, "dest": RUNFILE, "sha256": "0" * 64, "url": f"{base_url}/x.run"}
    result = fill(filler, [entry], cache)
    assert len(requests) == 1 + RETRIES
    assert [f["file"] for f in result["failed"]] == [RUNFILE]
    assert "IncompleteRead" in result["failed"][0]["error"]
    assert cache_files(cache) == []


def with_credentials(url: str) -> str:
    return url.replace("http://", "http://msgpu:s3cret@", 1)


def test_a_wheel_is_fetched_through_an_index_url_with_credentials(filler, served, cache):
    entry = dict(index_entry(served), index_url=with_credentials(served.url("simple")))
    result = fill(filler, [entry], cache)
    assert result["ok"] is True, result["failed"]
    assert (cache / WHEEL).read_bytes() == PAYLOADS[WHEEL]


def test_an_index_password_is_never_printed(filler, served, cache):
    entry = dict(index_entry(served), index_url=with_credentials(served.url("simple")))
    offline = fill(filler, [entry], cache, offline=True)
    online = fill(filler, [entry], cache)
    for text in (json.dumps(offline), filler.explain(offline, True), json.dumps(online), filler.explain(online, False)):
        assert "s3cret" not in text


# --- main(): the command line cache.yml runs -----------------------------------------------------
def test_main_fetches_and_writes_json_and_progress(filler, served, cache, tmp_path, capsys):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps([url_entry(served), index_entry(served)]))
    report = tmp_path / "out" / "result.json"
    report.parent.mkdir()
    argv = ["--cache", str(cache), "--manifest", str(manifest), "--retries", "0", "--delay", "0"]

    assert filler.main([*argv, "--json", str(report)]) == 0
    stdout = capsys.readouterr().out
    assert json.loads(stdout) == json.loads(report.read_text())
    result = json.loads(stdout)
    assert result["ok"] is True
    assert sorted(f["file"] for f in result["fetched"]) == sorted([RUNFILE, WHEEL])
    progress = (cache / ".fetch.log").read_text()
    assert "[artifact-cache] 2 files needed: 0 in the cache, 2 to fetch" in progress
    assert f"fetching {RUNFILE} (cuda) from {served.url(f'files/{RUNFILE}')}" in progress
    assert f"{WHEEL}: " in progress and "sha256 ok" in progress

    assert filler.main(argv) == 0
    assert sorted(json.loads(capsys.readouterr().out)["present"]) == sorted([RUNFILE, WHEEL])
    assert served.fetches(f"files/{RUNFILE}") == 1


def test_main_offline_with_missing_files_exits_1_and_explains(filler, served, cache, tmp_path, capsys):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps([url_entry(served)]))
    assert filler.main(["--cache", str(cache), "--manifest", str(manifest), "--offline"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["missing"][0]["file"] == RUNFILE
    assert "stack_offline is true and 1 file(s) are not in the artifact cache" in captured.err
    assert served.counts == {}


def test_the_script_reads_its_manifest_from_stdin(served, cache):
    """As cache.yml runs it: the script by its path, the manifest on stdin, exit 1 on a failure."""
    command = [sys.executable, str(FILLER), "--cache", str(cache), "--retries", "1", "--delay", "0"]
    ok = subprocess.run(command, input=json.dumps([url_entry(served)]), capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["fetched"][0]["file"] == RUNFILE

    served.inject(f"files/{TARBALL}", "down")
    bad = subprocess.run(
        command, input=json.dumps([url_entry(served, TARBALL, "cudnn")]), capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["failed"][0]["file"] == TARBALL
    assert f"could not fetch {TARBALL} (cudnn) from {served.url(f'files/{TARBALL}')}: HTTP Error 503" in bad.stderr
    assert served.fetches(f"files/{TARBALL}") == 2


# --- wheelhouse(): the paths that need no pip -----------------------------------------------------
REQUIREMENTS = ["mindspore-gpu==1.5.1", "numpy<1.24", "pillow<10"]


def stamp(folder: Path, requirements: list[str], python_tag: str) -> None:
    """The filler's record of what a finished wheelhouse holds (wheelhouse(), `.msgpu-requirements`)."""
    folder.mkdir(parents=True)
    (folder / "numpy-1.23.5-cp38-cp38-manylinux_2_17_x86_64.whl").write_bytes(b"wheel")
    wanted = json.dumps({"requirements": requirements, "python": python_tag}, sort_keys=True)
    (folder / ".msgpu-requirements").write_text(wanted)


def test_offline_without_a_wheelhouse_is_an_error(filler, tmp_path):
    folder = tmp_path / "wheelhouse" / "mindspore-gpu-1.5.1-cp38"
    result = filler.wheelhouse(folder, REQUIREMENTS, "cp38", "http://127.0.0.1:9/simple", True, [WHEEL])
    assert result["ok"] is False
    assert result["error"] == (
        f"the wheelhouse {folder} for mindspore-gpu==1.5.1, numpy<1.24, pillow<10 (cp38) is not in the cache"
    )
    assert not folder.exists()


@pytest.mark.parametrize("offline", [True, False])
def test_a_wheelhouse_whose_stamp_matches_is_kept_without_pip(filler, served, tmp_path, offline):
    folder = tmp_path / "wheelhouse" / "mindspore-gpu-1.5.1-cp38"
    stamp(folder, REQUIREMENTS, "cp38")
    before = sorted(p.name for p in folder.iterdir())
    result = filler.wheelhouse(folder, REQUIREMENTS, "cp38", served.url("simple"), offline, [WHEEL])
    assert result == {"wheelhouse": str(folder), "changed": False, "ok": True}
    assert served.counts == {}  # pip would have asked the index for the requirements
    assert sorted(p.name for p in folder.iterdir()) == before
    assert not folder.with_name(folder.name + ".partial").exists()


def test_a_wheelhouse_for_another_python_is_not_taken_offline(filler, tmp_path):
    folder = tmp_path / "wheelhouse" / "mindspore-gpu-1.5.1"
    stamp(folder, REQUIREMENTS, "cp39")
    result = filler.wheelhouse(folder, REQUIREMENTS, "cp38", "http://127.0.0.1:9/simple", True, [WHEEL])
    assert result["ok"] is False
    assert "(cp38) is not in the cache" in result["error"]


def test_main_offline_wheelhouse_missing_exits_1(filler, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    folder = tmp_path / "cache" / "wheelhouse" / "mindspore-gpu-1.5.1-cp38"
    argv = ["--cache", str(tmp_path / "cache"), "--wheelhouse", str(folder), "--python-tag", "cp38", "--offline"]
    assert filler.main([*argv, *(f"--requirement={r}" for r in REQUIREMENTS), "--exclude", WHEEL]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"] is False
    assert f"the wheelhouse {folder} for mindspore-gpu==1.5.1" in captured.err


def minimal_wheel(path: Path, name: str, version: str, tag: str) -> None:
    """A wheel pip accepts: its name and version in the file name and in .dist-info/METADATA."""
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n")
        wheel.writestr(f"{info}/RECORD", "")


@pytest.fixture
def wheel_index(tmp_path: Path):
    """A PEP 503 index on the loopback mirror with cp37 (abi cp37m, as CPython 3.7 wheels are tagged)
    and cp38 builds of `demo` 1.0 and of `dep` 1.0 and 2.0."""
    root = tmp_path / "index"
    builds = {"demo": ["1.0"], "dep": ["1.0", "2.0"]}
    for package, versions in builds.items():
        links = []
        for version in versions:
            for tag in ("cp37-cp37m-manylinux1_x86_64", "cp38-cp38-manylinux1_x86_64"):
                name = f"{package}-{version}-{tag}.whl"
                (root / "files").mkdir(parents=True, exist_ok=True)
                minimal_wheel(root / "files" / name, package, version, tag)
                links.append((name, f"../../files/{name}"))
        (root / "simple" / package).mkdir(parents=True)
        (root / "simple" / package / "index.html").write_text(pep503_page(*links))
    with mirror.serving(root) as running:
        yield running


def test_a_wheelhouse_is_filled_by_pip_from_the_index_then_kept(filler, wheel_index, tmp_path):
    folder = tmp_path / "cache" / "wheelhouse" / "demo-1.0-cp38"
    demo = "demo-1.0-cp38-cp38-manylinux1_x86_64.whl"
    args = (["demo==1.0", "dep<2"], "cp38", wheel_index.url("simple"), False, [demo])
    result = filler.wheelhouse(folder, *args)
    assert result["ok"] is True, result.get("error")
    assert result["changed"] is True
    assert sorted(p.name for p in folder.iterdir()) == [
        ".msgpu-requirements",
        "dep-1.0-cp38-cp38-manylinux1_x86_64.whl",
    ]
    assert not folder.with_name(folder.name + ".partial").exists()
    asked = dict(wheel_index.counts)
    assert asked["/simple/demo/"] >= 1 and asked["/simple/dep/"] >= 1

    assert filler.wheelhouse(folder, *args) == {"wheelhouse": str(folder), "changed": False, "ok": True}
    assert wheel_index.counts == asked  # the stamp matched: pip did not run again


def test_a_wheelhouse_for_python_3_7_takes_its_cp37m_wheels(filler, wheel_index, tmp_path):
    folder = tmp_path / "cache" / "wheelhouse" / "demo-1.0-cp37"
    result = filler.wheelhouse(folder, ["demo==1.0"], "cp37", wheel_index.url("simple"), False, [])
    assert result["ok"] is True, result.get("error")
    assert sorted(p.name for p in folder.glob("*.whl")) == ["demo-1.0-cp37-cp37m-manylinux1_x86_64.whl"]


# --- the resolver: what the cache must hold, and where the roles find it ---------------------------
CACHE_DIR = "/srv/msgpu-cache"


@pytest.fixture
def resolve(stack_catalog, catalog, pinned):
    def run(**settings) -> dict[str, Any]:
        return stack_catalog.resolve_stack(catalog, {"artifact_checksums": pinned, **settings})

    return run


def pinned_artifacts(stack: dict[str, Any]) -> list[dict[str, Any]]:
    """Every file the default stack's chosen methods download."""
    found = [t["artifact"] for t in stack["cuda"]["toolkits"]]
    found += [stack[c].get("artifact", {}) for c in ("cudnn", "nccl", "tensorrt", "driver")]
    found += list(stack["mindspore"]["wheels"].values())
    return [a for a in found if a.get("file")]


def test_a_cache_dir_points_every_pinned_artifact_at_the_cache(resolve):
    result = resolve(artifact_cache_dir=CACHE_DIR + "/")
    assert result["errors"] == []
    stack = result["stack"]
    artifacts = pinned_artifacts(stack)
    assert {a["file"] for a in artifacts} >= {RUNFILE, TARBALL, WHEEL}
    for artifact in artifacts:
        assert artifact["local_path"] == f"{CACHE_DIR}/{artifact['file']}", artifact
        assert artifact["cached"] is True
    cache = stack["artifact_cache"]
    assert (cache["dir"], cache["offline"]) == (CACHE_DIR, False)
    assert cache["wheelhouse"] == f"{CACHE_DIR}/wheelhouse/mindspore-gpu-1.5.1"


def test_downloads_say_where_each_file_comes_from(resolve):
    stack = resolve(artifact_cache_dir=CACHE_DIR)["stack"]
    downloads = {d["file"]: d for d in stack["artifact_cache"]["downloads"]}
    for artifact in pinned_artifacts(stack):
        entry = downloads[artifact["file"]]
        assert (entry["dest"], entry["sha256"]) == (artifact["file"], artifact["sha256"])
        if artifact.get("source") == "pypi":
            assert (entry["index_url"], entry["package"]) == ("https://pypi.org/simple", package_of(artifact["file"]))
            assert "url" not in entry
        else:
            assert entry["url"] == artifact["url"] and entry["url"].startswith("https://")
    assert downloads[RUNFILE]["component"] == "cuda"
    assert downloads[WHEEL]["python_tag"] == "cp38"
    assert {d["component"] for d in downloads.values()} == {"cuda", "cudnn", "nccl", "mindspore", "mnist"}


def test_mnist_is_cached_under_mnist(resolve, catalog):
    stack = resolve(artifact_cache_dir=CACHE_DIR, sources={"mnist": "http://127.0.0.1:8000/mnist/"})["stack"]
    assert stack["mnist"]["cache_dir"] == f"{CACHE_DIR}/mnist"
    mnist = [d for d in stack["artifact_cache"]["downloads"] if d["component"] == "mnist"]
    assert {d["file"]: d["sha256"] for d in mnist} == catalog["mnist"]["files"]
    for entry in mnist:
        assert entry["dest"] == f"mnist/{entry['file']}"
        assert entry["url"] == f"http://127.0.0.1:8000/mnist/{entry['file']}"


def test_without_a_cache_dir_nothing_points_at_a_cache(resolve):
    result = resolve()
    assert result["errors"] == []
    stack = result["stack"]
    for artifact in pinned_artifacts(stack):
        assert "local_path" not in artifact and "cached" not in artifact
    assert (stack["artifact_cache"]["dir"], stack["artifact_cache"]["wheelhouse"]) == ("", "")
    assert stack["mnist"]["cache_dir"] == ""


def test_the_users_local_artifacts_are_not_cached(stack_catalog, catalog, pinned, tmp_path):
    tarball = tmp_path / TARBALL
    tarball.write_bytes(PAYLOADS[TARBALL])
    settings = {
        "artifact_checksums": pinned,
        "local_artifacts": {TARBALL: str(tarball)},
        "artifact_cache_dir": CACHE_DIR,
    }
    result = stack_catalog.resolve_stack(catalog, settings)
    assert result["errors"] == []
    artifact = result["stack"]["cudnn"]["artifact"]
    assert artifact["local_path"] == str(tarball)
    assert "cached" not in artifact
    assert TARBALL not in {d["file"] for d in result["stack"]["artifact_cache"]["downloads"]}


@pytest.mark.parametrize(
    ("settings", "variable", "expected"),
    [
        pytest.param({"artifact_cache_dir": "cache/msgpu"}, "stack_artifact_cache_dir", "absolute", id="relative"),
        pytest.param({"artifact_cache_dir": 5}, "stack_artifact_cache_dir", "not an absolute path", id="not-text"),
        pytest.param({"offline": True}, "stack_offline", "stack_artifact_cache_dir is empty", id="offline-no-cache"),
        pytest.param(
            {"offline": "yes", "artifact_cache_dir": CACHE_DIR}, "stack_offline", "allowed: true, false", id="not-bool"
        ),
    ],
)
def test_bad_cache_settings_are_refused(resolve, settings, variable, expected):
    errors = resolve(**settings)["errors"]
    matching = [e for e in errors if e.startswith(f"{variable}: ")]
    assert matching, errors
    assert any(expected in e for e in matching), matching


def test_offline_with_a_cache_dir_resolves(resolve):
    result = resolve(artifact_cache_dir=CACHE_DIR, offline=True)
    assert result["errors"] == []
    assert result["stack"]["artifact_cache"]["offline"] is True


# --- cache_manifest(), cache_wheelhouses(), cache_components() -----------------------------------
def test_hosts_with_the_same_stack_need_each_file_once(stack_catalog, resolve):
    stack = resolve(artifact_cache_dir=CACHE_DIR)["stack"]
    manifest = CACHE_FILTERS.cache_manifest([stack, stack, stack], ["cp38"] * 3, ALL_COMPONENTS)
    dests = [e["dest"] for e in manifest]
    assert dests == sorted(set(dests))
    assert set(dests) == {RUNFILE, TARBALL, NCCL_WHEEL, WHEEL}


def test_hosts_with_different_pythons_need_both_wheels(stack_catalog, resolve):
    stack = resolve(artifact_cache_dir=CACHE_DIR)["stack"]
    manifest = CACHE_FILTERS.cache_manifest([stack, stack], ["cp38", "cp39"], ["mindspore"])
    assert [e["file"] for e in manifest] == [WHEEL, WHEEL.replace("cp38", "cp39")]


@pytest.mark.parametrize(
    ("components", "files"),
    [
        (["cudnn"], [TARBALL]),
        (["cuda", "tensorrt"], [RUNFILE]),  # TensorRT is off by default: nothing to fetch for it
        ([], []),
    ],
)
def test_the_manifest_holds_only_the_chosen_components(stack_catalog, resolve, components, files):
    stack = resolve(artifact_cache_dir=CACHE_DIR)["stack"]
    assert [e["file"] for e in CACHE_FILTERS.cache_manifest([stack], ["cp38"], components)] == files


def test_the_mnist_component_lists_the_dataset(stack_catalog, resolve, catalog):
    stack = resolve(artifact_cache_dir=CACHE_DIR)["stack"]
    manifest = CACHE_FILTERS.cache_manifest([stack], ["cp38"], ["mnist"])
    assert sorted(e["dest"] for e in manifest) == sorted(f"mnist/{name}" for name in catalog["mnist"]["files"])


def test_one_wheelhouse_per_python_tag(stack_catalog, resolve):
    stack = resolve(artifact_cache_dir=CACHE_DIR)["stack"]
    houses = CACHE_FILTERS.cache_wheelhouses([stack, stack, stack], ["cp38", "cp39", "cp38"], ALL_COMPONENTS)
    base = f"{CACHE_DIR}/wheelhouse/mindspore-gpu-1.5.1"
    assert houses == [
        {
            "dir": f"{base}-{tag}",
            "python_tag": tag,
            "requirements": ["mindspore-gpu==1.5.1", *stack["mindspore"]["pins"]],
            "exclude": [stack["mindspore"]["wheels"][tag]["file"]],
            "index_url": "https://pypi.org/simple",
        }
        for tag in ("cp38", "cp39")
    ]
    assert set(houses[0]["requirements"][1:]) == {"numpy<1.24", "pillow<10"}


def test_no_wheelhouse_without_mindspore_or_without_a_cache(stack_catalog, resolve):
    cached = resolve(artifact_cache_dir=CACHE_DIR)["stack"]
    assert CACHE_FILTERS.cache_wheelhouses([cached], ["cp38"], ["cuda", "cudnn"]) == []
    assert CACHE_FILTERS.cache_wheelhouses([resolve()["stack"]], ["cp38"], ALL_COMPONENTS) == []
    assert CACHE_FILTERS.cache_wheelhouses([cached], ["cp310"], ALL_COMPONENTS) == []  # no wheel for it


PRESENT = dict.fromkeys(ALL_COMPONENTS, "present")


@pytest.mark.parametrize(
    ("states", "run_tags", "skip_tags", "chosen", "expected"),
    [
        pytest.param(PRESENT, ["all"], [], None, ALL_COMPONENTS, id="all"),
        pytest.param(PRESENT, ["cuda"], [], None, ["cuda"], id="tags-cuda"),
        pytest.param(PRESENT, ["role::cuda", "nccl"], [], None, ["cuda", "nccl"], id="tags-role-cuda"),
        pytest.param(PRESENT, ["preflight"], [], None, [], id="tags-preflight-only"),
        pytest.param(
            PRESENT,
            ["all"],
            ["cuda", "role::tensorrt"],
            None,
            ["nvidia_driver", "cudnn", "nccl", "mindspore"],
            id="skip",
        ),
        pytest.param(
            {**PRESENT, "cudnn": "absent"},
            ["all"],
            [],
            None,
            ["nvidia_driver", "cuda", "nccl", "tensorrt", "mindspore"],
            id="state-absent",
        ),
        pytest.param(PRESENT, ["all"], [], ["cudnn", "mnist"], ["cudnn", "mnist"], id="explicit"),
        pytest.param({**PRESENT, "cudnn": "absent"}, ["all"], [], ["cudnn"], [], id="explicit-absent"),
    ],
)
def test_cache_components(stack_catalog, states, run_tags, skip_tags, chosen, expected):
    assert CACHE_FILTERS.cache_components(states, run_tags, skip_tags, chosen) == expected


# --- the resolver's manifest, filled from a mirror --------------------------------------------------
def test_the_resolved_manifest_fills_the_cache_from_a_mirror(filler, stack_catalog, catalog, pinned, tmp_path):
    """End to end on the controller: resolve the default stack against a mirror, fill the cache
    with its manifest, and find every cached artifact at its local_path with the right bytes."""
    root = tmp_path / "mirror"
    cache = tmp_path / "cache"
    probe = stack_catalog.resolve_stack(catalog, {"artifact_checksums": pinned, "artifact_cache_dir": str(cache)})
    chosen = [a for a in pinned_artifacts(probe["stack"]) if a["file"] != WHEEL.replace("cp38", "cp39")]
    payloads = {a["file"]: a["file"].encode() * 500 for a in chosen}
    for artifact in chosen:
        place = (
            root / "simple-files" / artifact["file"] if artifact.get("source") == "pypi" else root / artifact["path"]
        )
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_bytes(payloads[artifact["file"]])
    wheels = [a["file"] for a in chosen if a.get("source") == "pypi"]
    for package in sorted({package_of(name) for name in wheels}):
        page = root / "pypi" / package / "index.html"
        page.parent.mkdir(parents=True)
        listed = [name for name in wheels if package_of(name) == package]
        page.write_text(pep503_page(*((name, f"../../simple-files/{name}") for name in listed)))

    with mirror.serving(root) as served:
        settings = {
            "artifact_cache_dir": str(cache),
            "artifact_checksums": {**pinned, **{name: sha256(data) for name, data in payloads.items()}},
            "sources": {"nvidia_developer": served.base_url, "pypi": served.url("pypi")},
        }
        result = stack_catalog.resolve_stack(catalog, settings)
        assert result["errors"] == []
        stack = result["stack"]
        manifest = CACHE_FILTERS.cache_manifest([stack, stack], ["cp38", "cp37"], ALL_COMPONENTS)
        filled = fill(filler, manifest, cache)
        again = fill(filler, manifest, cache)

    assert filled["ok"] is True, filled
    assert sorted(f["file"] for f in filled["fetched"]) == sorted(payloads)
    assert sorted(again["present"]) == sorted(payloads) and again["fetched"] == []
    pages = {path: count for path, count in served.counts.items() if path.endswith("/")}
    # Each package's page looked up once per wheel of it.
    projects = [package_of(name) for name in wheels]
    assert pages == {f"/pypi/{package}/": projects.count(package) for package in set(projects)}
    assert sorted(count for path, count in served.counts.items() if path not in pages) == [1] * len(payloads)
    for artifact in pinned_artifacts(stack):
        if artifact["file"] in payloads:
            assert Path(artifact["local_path"]).read_bytes() == payloads[artifact["file"]]


def test_tensorrt_wheels_are_cached_per_python_tag_like_mindspores(resolve, stack_catalog, catalog):
    """The wheel method's nvidia-tensorrt wheel (~800 MB) is fetched once by the controller for the hosts'
    Python, like MindSpore's wheel, instead of by every host from the index (and so it installs offline)."""
    # A catalog TensorRT with the wheel method that fits the default stack's CUDA.
    cuda = catalog["stacks"][catalog["default_stack"]]["cuda"]
    version = next(v for v, e in catalog["tensorrt"].items() if "wheel" in e and cuda in e["cuda"])
    result = resolve(
        artifact_cache_dir=CACHE_DIR, tensorrt_enabled=True, tensorrt_method="wheel", tensorrt_version=version
    )
    assert result["errors"] == []
    stack = result["stack"]
    wheels = stack["tensorrt"]["artifact"]["files"]
    catalog_files = catalog["tensorrt"][version]["wheel"]["files"]
    assert set(wheels) == set(catalog_files)
    for tag, wheel in wheels.items():
        assert (wheel["file"], wheel["sha256"]) == (catalog_files[tag]["file"], catalog_files[tag]["sha256"])
        assert wheel["requirement"] == f"{catalog['tensorrt'][version]['wheel']['package']}=={version}"
        assert wheel["local_path"] == f"{CACHE_DIR}/{wheel['file']}"
    downloads = [d for d in stack["artifact_cache"]["downloads"] if d["component"] == "tensorrt"]
    assert {d["python_tag"]: d["file"] for d in downloads} == {t: w["file"] for t, w in wheels.items()}
    assert all(d["package"] == "nvidia-tensorrt" for d in downloads)
    cp38 = CACHE_FILTERS.cache_manifest([stack], ["cp38"], ["tensorrt"])
    assert [e["file"] for e in cp38] == [catalog_files["cp38"]["file"]]


def test_a_local_artifact_without_a_pinned_sum_is_pinned_by_the_controller_copys_sha256(
    stack_catalog, catalog, pinned, tmp_path
):
    """The hosts' copies must match the file the user gave: an artifact no public sum pins (TensorRT 7.2's
    tarball) gets its controller copy's sha256; one the catalog pins keeps the catalog's sum, so a copy that
    differs from NVIDIA's file is refused on the host."""
    # The default stack's TensorRT tarball, which no public sum pins.
    tarball_entry = catalog["tensorrt"][catalog["stacks"][catalog["default_stack"]]["tensorrt"]]["tarball"]
    name = tarball_entry["file"]
    assert tarball_entry["sha256"] is None
    tarball = tmp_path / name
    tarball.write_bytes(b"the user's own TensorRT tarball")
    own_cudnn = tmp_path / TARBALL
    own_cudnn.write_bytes(b"not NVIDIA's cuDNN tarball")
    settings = {
        "artifact_checksums": {k: v for k, v in pinned.items() if k != name},
        "local_artifacts": {name: str(tarball), TARBALL: str(own_cudnn)},
        "tensorrt_enabled": True,
    }
    result = stack_catalog.resolve_stack(catalog, settings)
    assert result["errors"] == []
    assert result["stack"]["tensorrt"]["artifact"]["sha256"] == hashlib.sha256(tarball.read_bytes()).hexdigest()
    cudnn = result["stack"]["cudnn"]["artifact"]
    assert cudnn["sha256"] == pinned.get(TARBALL, catalog_sha256(catalog, TARBALL))
    assert cudnn["sha256"] != hashlib.sha256(own_cudnn.read_bytes()).hexdigest()
    missing = stack_catalog.resolve_stack(
        catalog, {**settings, "local_artifacts": {name: str(tmp_path / "gone.tar.gz")}}
    )
    assert any(e.startswith(f"stack_local_artifacts.{name}: ") for e in missing["errors"])


def catalog_sha256(catalog, file: str) -> str:
    """The catalog's sha256 of a cuDNN file."""
    for entry in catalog["cudnn"].values():
        for method in entry.values():
            if isinstance(method, dict) and method.get("file") == file:
                return method["sha256"]
    raise KeyError(file)


def test_the_offline_lookup_names_the_wheelhouses_already_filled(filler, tmp_path, capsys):
    """tasks/cache.yml's one lookup: the files in the cache and the wheelhouses filled for their requirements and
    Python (another Python's or another requirement list's is not ready: pip runs for it)."""
    cache = tmp_path / "cache"
    ready = cache / "wheelhouse" / "mindspore-gpu-1.5.1-cp38"
    stamp(ready, REQUIREMENTS, "cp38")
    other_python = cache / "wheelhouse" / "mindspore-gpu-1.5.1-cp39"
    stamp(other_python, REQUIREMENTS, "cp38")
    houses = [
        {"dir": str(ready), "requirements": REQUIREMENTS, "python_tag": "cp38"},
        {"dir": str(other_python), "requirements": REQUIREMENTS, "python_tag": "cp39"},
        {"dir": str(cache / "wheelhouse" / "none"), "requirements": REQUIREMENTS[:1], "python_tag": "cp38"},
    ]
    manifest = tmp_path / "manifest.json"
    manifest.write_text("[]")
    argv = ["--cache", str(cache), "--manifest", str(manifest), "--offline", "--wheelhouses", json.dumps(houses)]
    assert filler.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["wheelhouses_ready"] == [str(ready)]


# --- the user's copies of pinned files, checked in the preflight (--check-local) ------------------------------


def test_local_pins_lists_the_users_copies_of_pinned_files_once(stack_catalog, catalog, pinned, tmp_path):
    tarball = tmp_path / TARBALL
    tarball.write_bytes(PAYLOADS[TARBALL])
    settings = {"artifact_checksums": pinned, "local_artifacts": {TARBALL: str(tarball)}}
    stack = stack_catalog.resolve_stack(catalog, settings)["stack"]
    pins = stack_catalog.local_pins([stack, stack, {}])
    ((pin),) = pins
    assert (
        pin["file"] == TARBALL and pin["path"] == str(tarball) and pin["setting"] == f"stack_local_artifacts.{TARBALL}"
    )
    assert pin["sha256"] == catalog["cudnn"]["8.0.5"]["tarball"]["sha256"]
    assert pin["pin"].startswith("the catalog's sha256 (Spack cudnn recipe")
    # The user's own sum for the file is the pin then; a copy without any pin has none (its own sum is taken).
    stack = stack_catalog.resolve_stack(catalog, {**settings, "artifact_checksums": {**pinned, TARBALL: "cd" * 32}})
    ((pin),) = stack_catalog.local_pins([stack["stack"]])
    assert pin["sha256"] == "cd" * 32 and pin["pin"] == f"stack_artifact_checksums.{TARBALL}"
    unpinned = {k: v for k, v in pinned.items() if k != TARBALL}
    catalog_without = json.loads(json.dumps(catalog))
    catalog_without["cudnn"]["8.0.5"]["tarball"]["sha256"] = None
    stack = stack_catalog.resolve_stack(catalog_without, {**settings, "artifact_checksums": unpinned})["stack"]
    assert stack_catalog.local_pins([stack]) == []
    assert stack["cudnn"]["artifact"]["sha256"] == sha256(PAYLOADS[TARBALL])


def check_local(filler, pins: list[dict], cache: str = "") -> subprocess.CompletedProcess:
    argv = [sys.executable, str(FILLER), "--check-local"] + (["--cache", cache] if cache else [])
    return subprocess.run(argv, input=json.dumps(pins), capture_output=True, text=True, timeout=60)


def test_check_local_names_the_setting_both_sums_and_the_pin(filler, tmp_path):
    good, bad = tmp_path / "good.tgz", tmp_path / "bad.tgz"
    good.write_bytes(PAYLOADS[TARBALL])
    bad.write_bytes(b"something else")
    pin = {"file": TARBALL, "sha256": sha256(PAYLOADS[TARBALL]), "pin": "the catalog's sha256 (Spack)"}
    pins = [
        {**pin, "path": str(good), "setting": "stack_local_artifacts.a"},
        {**pin, "path": str(bad), "setting": "stack_local_artifacts.b"},
        {**pin, "path": str(tmp_path / "gone"), "setting": "stack_local_artifacts.c"},
    ]
    result = check_local(filler, pins)
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["checked"] == [TARBALL] * 3
    assert document["errors"] == [
        f"stack_local_artifacts.b: '{bad}' has sha256 {sha256(b'something else')}, but {TARBALL} is pinned to "
        f"{pin['sha256']} by the catalog's sha256 (Spack); allowed: the file with that sum (download it again), or "
        "your file's sum in stack_artifact_checksums if you trust it.",
        f"stack_local_artifacts.c: '{tmp_path / 'gone'}' is not a readable file on the controller.",
    ]
    assert result.stderr.splitlines() == document["errors"]
    assert check_local(filler, pins[:1]).returncode == 0


def test_check_local_reads_an_unchanged_copy_once_with_a_cache_folder(filler, tmp_path, cache):
    copy = tmp_path / "copy.tgz"
    copy.write_bytes(PAYLOADS[TARBALL])
    pins = [{"file": TARBALL, "path": str(copy), "sha256": sha256(PAYLOADS[TARBALL]), "pin": "p", "setting": "s"}]
    cache.mkdir(parents=True, exist_ok=True)
    assert check_local(filler, pins, str(cache)).returncode == 0
    memo = json.loads((cache / MEMO).read_text())
    key = "local:" + str(copy.resolve())
    assert memo[key][3] == sha256(PAYLOADS[TARBALL])
    # The memo says the sum of the file as it was: the same size, mtime and inode are not read again...
    memo[key][3] = "ef" * 32
    (cache / MEMO).write_text(json.dumps(memo))
    assert json.loads(check_local(filler, pins, str(cache)).stdout)["ok"] is False
    # ...and a rewritten copy is.
    copy.write_bytes(PAYLOADS[TARBALL])
    os.utime(copy, ns=(1, 1))
    assert check_local(filler, pins, str(cache)).returncode == 0
    assert cache_files(cache) == []  # nothing but the memo (and the lock) in the cache


def test_check_local_refuses_a_cache_folder_the_controller_cannot_write(filler, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = check_local(filler, [], str(blocker / "cache"))
    assert result.returncode == 1
    (error,) = json.loads(result.stdout)["errors"]
    assert error == (
        f"stack_artifact_cache_dir: '{blocker / 'cache'}' cannot be created or written on the controller (Not a "
        "directory); allowed: a folder the user running ansible-playbook can write, or '' (each host downloads its "
        "own files)."
    )
    # A folder that can be made is made (the fill would make it anyway), and passes.
    assert check_local(filler, [], str(tmp_path / "new" / "cache")).returncode == 0
    assert (tmp_path / "new" / "cache").is_dir()


def test_the_preflight_names_an_unwritable_cache_folder_instead_of_a_template_error(tmp_path):
    """Through ansible-playbook (playbooks/fetch.yml: the stack's config and cache, no host contacted)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    settings = {"stack_artifact_cache_dir": str(blocker / "cache"), "artifacts_cache_components": ["mindspore"]}
    result = controller_playbook(tmp_path, "playbooks/fetch.yml", {"h1": host}, "-e", json.dumps(settings))
    output = " ".join(result.stdout.replace("''", "'").split())
    assert result.returncode != 0
    assert f"stack_artifact_cache_dir: '{blocker / 'cache'}' cannot be created or written on the controller" in output
    assert "filter plugin" not in result.stdout + result.stderr  # no raw template error
