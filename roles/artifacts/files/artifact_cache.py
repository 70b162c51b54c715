#!/usr/bin/env python3
"""Fill the controller's artifact cache: fetch each file once, check its sha256, keep it.

Run by the artifacts role (tasks/cache.yml, tasks/check_local.yml) on the controller, and usable alone:

    python3 artifact_cache.py --cache DIR --manifest FILE [--offline] [--json OUT]

FILE is a JSON list of entries (roles/stack/filter_plugins/stack_catalog.py `apply_cache`):
``{"component", "file", "dest", "sha256", "url"}`` or, for a wheel on a pip index,
``{"component", "file", "dest", "sha256", "index_url", "package"}`` (the file's link is looked up on
the index's PEP 503 page, so any mirror of PyPI works). A file already in the cache with the right
checksum is never fetched again. Downloads go to a temporary name next to the target and are renamed
only after the checksum matched, so the cache never holds a partial or unverified file. Progress goes
to stderr; the JSON result (present/fetched/missing/failed, bytes, seconds) to --json and stdout.

--wheelhouse DIR --requirement REQ... --python-tag cp38 fills DIR with the wheels pip resolves (from
$PIP_INDEX_URL) for those requirements on that interpreter (manylinux x86_64), for hosts without an index.
With a manifest, --wheelhouses JSON also says which wheelhouses are filled already (`wheelhouses_ready`), so
the stack role's one lookup covers both and runs pip only for a wheelhouse that is not.

Exit status: 0 when every file is in the cache, 1 otherwise (the message names each missing file
and where it would come from). Standard library only (Python 3.8+).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import html.parser
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

CHUNK = 1024 * 1024
PROGRESS_EVERY = 5.0  # seconds between progress lines of one download


class FetchError(Exception):
    pass


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for block in iter(lambda: data.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


# Progress also goes to <cache>/.fetch.log: Ansible shows a command's stderr only when it ends, so
# `./toolkit fetch` follows this file to show a long download while it runs.
PROGRESS_LOG: Optional[Path] = None


def log(message: str) -> None:
    line = f"[artifact-cache] {message}"
    print(line, file=sys.stderr, flush=True)
    if PROGRESS_LOG is not None:
        with contextlib.suppress(OSError), open(PROGRESS_LOG, "a") as progress:
            progress.write(line + "\n")


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: Dict[str, str] = {}
        self._href: Optional[str] = None

    def handle_starttag(self, tag: str, attrs: List[Any]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.links[data.strip()] = self._href

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._href = None


def split_credentials(url: str) -> Tuple[str, Optional[str]]:
    """`url` without its user:password@ part, and the Basic Authorization header for it (urllib
    ignores credentials in a URL; a private mirror's index URL may carry them, as pip allows)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), f"Basic {token}"


def redact(url: str) -> str:
    """`url` fit for a log or a message: never its password."""
    return split_credentials(url)[0]


def urlopen(url: str, timeout: float) -> Any:
    plain, authorization = split_credentials(url)
    request = urllib.request.Request(plain)
    if authorization:
        request.add_header("Authorization", authorization)
    return urllib.request.urlopen(request, timeout=timeout)


def wheel_url(index_url: str, package: str, file: str, timeout: float) -> str:
    """The download link of `file` on a PEP 503 simple index page (a relative link keeps the
    index's credentials: same host)."""
    name = re.sub(r"[-_.]+", "-", package).lower()
    page = f"{index_url.rstrip('/')}/{name}/"
    with urlopen(page, timeout) as response:
        parser = _Links()
        parser.feed(response.read().decode("utf-8", "replace"))
    if file not in parser.links:
        raise FetchError(f"{file} is not listed on {redact(page)}")
    return urllib.parse.urljoin(page, parser.links[file]).split("#", 1)[0]


def source_of(entry: Dict[str, Any]) -> str:
    if entry.get("url"):
        return redact(str(entry["url"]))
    return f"{entry.get('package')} on the pip index {redact(str(entry.get('index_url')))}"


def download(url: str, target: Path, sha256: str, timeout: float) -> int:
    """Download to a temporary file next to `target`; rename it only when the checksum matches."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=str(target.parent))
    digest = hashlib.sha256()
    received = 0
    try:
        with os.fdopen(handle, "wb") as out, urlopen(url, timeout) as response:
            total = int(response.headers.get("Content-Length") or 0)
            started = last = time.monotonic()
            for block in iter(lambda: response.read(CHUNK), b""):
                out.write(block)
                digest.update(block)
                received += len(block)
                now = time.monotonic()
                if now - last >= PROGRESS_EVERY:
                    last = now
                    rate = received / max(now - started, 1e-6)
                    share = f"{100 * received / total:.0f}% of {human(total)}" if total else human(received)
                    log(f"  {target.name}: {share}, {human(rate)}/s")
        if total and received < total:
            raise FetchError(f"the connection closed after {received} of {total} bytes")
        if digest.hexdigest() != sha256:
            raise FetchError(f"its sha256 is {digest.hexdigest()}, the catalog pins {sha256}")
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
        return received
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def fetch_one(entry: Dict[str, Any], cache: Path, retries: int, delay: float, timeout: float) -> Dict[str, Any]:
    target = cache / entry["dest"]
    started = time.monotonic()
    error = ""
    for attempt in range(1 + retries):
        try:
            url = entry.get("url") or wheel_url(entry["index_url"], entry["package"], entry["file"], timeout)
            log(f"fetching {entry['file']} ({entry['component']}) from {redact(url)}")
            size = download(url, target, entry["sha256"], timeout)
            seconds = time.monotonic() - started
            log(f"  {entry['file']}: {human(size)} in {seconds:.1f} s, sha256 ok")
            return {"file": entry["file"], "bytes": size, "seconds": round(seconds, 2), "url": redact(url)}
        except (OSError, FetchError, urllib.error.URLError, http.client.HTTPException) as exc:
            error = str(exc)
            log(f"  {entry['file']}: attempt {attempt + 1} of {1 + retries} failed: {error}")
            if attempt < retries:
                time.sleep(delay)
    raise FetchError(f"{entry['file']} ({entry['component']}) from {source_of(entry)}: {error}")


# The cache's lock file: one filler at a time (the test bed's disk upkeep takes it too).
LOCK = ".lock"


@contextlib.contextmanager
def locked(cache: Path) -> Iterator[None]:
    """One filler at a time per cache (two playbooks may start at once)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# The sha256 of each cache file as last read, with the file's size, mtime and inode: a file unchanged since
# then is not read again (a real CUDA runfile is 3 GB, and every run asks which files are present). Every
# writer here renames a verified temporary file into place (a new inode and mtime), so a changed file is
# always read again; and each host checks its copy's sha256 again before using it (roles/artifacts).
MEMO = ".sha256-memo.json"


def load_memo(cache: Path) -> Dict[str, List[Any]]:
    try:
        memo = json.loads((cache / MEMO).read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def save_memo(cache: Path, memo: Dict[str, List[Any]]) -> None:
    with tempfile.NamedTemporaryFile("w", dir=cache, prefix=MEMO + ".", delete=False) as out:
        json.dump(memo, out, sort_keys=True)
    os.replace(out.name, cache / MEMO)


def cached_sha256(target: Path, dest: str, memo: Optional[Dict[str, List[Any]]]) -> str:
    """The sha256 of a cache file ("" when it is not a regular file), read only when the memo does not
    know the file as it is now."""
    try:
        info = target.stat()
    except OSError:
        return ""
    if not target.is_file():
        return ""
    key = [info.st_size, info.st_mtime_ns, info.st_ino]
    known = (memo or {}).get(dest)
    if isinstance(known, list) and known[:3] == key and len(known) == 4:
        return str(known[3])
    digest = sha256_of(target)
    if memo is not None:
        memo[dest] = [*key, digest]
    return digest


def present(entry: Dict[str, Any], cache: Path, memo: Optional[Dict[str, List[Any]]] = None) -> bool:
    return cached_sha256(cache / entry["dest"], entry["dest"], memo) == entry["sha256"]


def fill(manifest: List[Dict[str, Any]], cache: Path, offline: bool, retries: int, delay: float, timeout: float):
    result: Dict[str, Any] = {"cache": str(cache), "present": [], "fetched": [], "missing": [], "failed": []}
    started = time.monotonic()
    with locked(cache):
        memo = load_memo(cache)
        known = json.dumps(memo, sort_keys=True)
        todo = []
        for entry in manifest:
            if present(entry, cache, memo):
                result["present"].append(entry["file"])
            elif offline:
                missing = {"file": entry["file"], "component": entry["component"], "from": source_of(entry)}
                result["missing"].append(missing)
            else:
                todo.append(entry)
        log(f"{len(manifest)} files needed: {len(result['present'])} in the cache, {len(todo)} to fetch")
        for number, entry in enumerate(todo, 1):
            log(f"[{number}/{len(todo)}]")
            try:
                result["fetched"].append(fetch_one(entry, cache, retries, delay, timeout))
            except FetchError as exc:
                result["failed"].append({"file": entry["file"], "component": entry["component"], "error": str(exc)})
            else:  # its sha256 was checked while it downloaded, before the rename
                info = (cache / entry["dest"]).stat()
                memo[entry["dest"]] = [info.st_size, info.st_mtime_ns, info.st_ino, entry["sha256"]]
        if json.dumps(memo, sort_keys=True) != known:
            save_memo(cache, memo)
    result["bytes_fetched"] = sum(item["bytes"] for item in result["fetched"])
    result["seconds"] = round(time.monotonic() - started, 2)
    result["ok"] = not result["missing"] and not result["failed"]
    return result


def explain(result: Dict[str, Any], offline: bool) -> str:
    lines = []
    if result["missing"]:
        lines.append(
            f"stack_offline is true and {len(result['missing'])} file(s) are not in the artifact cache "
            f"{result['cache']} (stack_artifact_cache_dir); nothing was changed on any host:"
        )
        lines += [f"  - {m['file']} ({m['component']}), from {m['from']}" for m in result["missing"]]
        lines.append("Fill it with `./toolkit fetch` where the internet is reachable, then copy the folder here.")
    for failure in result["failed"]:
        lines.append(f"could not fetch {failure['error']}")
    return "\n".join(lines)


STAMP = ".msgpu-requirements"


def _stamp_text(requirements: List[str], python_tag: str) -> str:
    return json.dumps({"requirements": requirements, "python": python_tag}, sort_keys=True)


def wheelhouse_ready(folder: Path, requirements: List[str], python_tag: str) -> bool:
    """Whether `folder` is a finished wheelhouse of those requirements for `python_tag` (its stamp says so)."""
    stamp = folder / STAMP
    return stamp.is_file() and stamp.read_text() == _stamp_text(requirements, python_tag)


def wheelhouse(
    folder: Path, requirements: List[str], python_tag: str, index_url: str, offline: bool, exclude: List[str]
) -> Dict[str, Any]:
    """pip download the requirements' wheels for a manylinux x86_64 host with `python_tag`; the
    `exclude` files (the MindSpore wheel, which the cache holds on its own) are not kept."""
    wanted = _stamp_text(requirements, python_tag)
    if wheelhouse_ready(folder, requirements, python_tag):
        return {"wheelhouse": str(folder), "changed": False, "ok": True}
    if offline:
        return {
            "wheelhouse": str(folder),
            "ok": False,
            "error": f"the wheelhouse {folder} for {', '.join(requirements)} ({python_tag}) is not in the cache",
        }
    version = python_tag[2:]
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    # The controller's own pip configuration (find-links, constraints) must not decide what the
    # hosts get: only the stack's index (PIP_INDEX_URL, never on a command line) and CA settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=index_url, PIP_DISABLE_PIP_VERSION_CHECK="1")
    command = [sys.executable, "-m", "pip", "download", "--dest", str(staging), "--only-binary=:all:"]
    command += ["--platform", "manylinux2014_x86_64", "--platform", "manylinux2010_x86_64"]
    command += ["--platform", "manylinux1_x86_64", "--platform", "linux_x86_64"]
    command += ["--python-version", version, "--implementation", "cp", "--abi", python_tag]
    if python_tag in ("cp36", "cp37"):  # CPython before 3.8 tags its ABI with "m" (pymalloc)
        command += ["--abi", python_tag + "m"]
    command += requirements
    log(f"pip download {' '.join(requirements)} for {python_tag} into {folder}")
    started = time.monotonic()
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        return {"wheelhouse": str(folder), "ok": False, "error": f"pip download failed: {run.stderr.strip()[-1500:]}"}
    for name in exclude:
        with contextlib.suppress(FileNotFoundError):
            (staging / name).unlink()
    size = sum(p.stat().st_size for p in staging.iterdir())
    (staging / STAMP).write_text(wanted)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(staging, folder)
    log(f"  {len(list(folder.glob('*.whl')))} wheels, {human(size)} in {time.monotonic() - started:.1f} s")
    return {"wheelhouse": str(folder), "changed": True, "ok": True, "bytes": size}


def check_local(pins: List[Dict[str, Any]], memo: Optional[Dict[str, List[Any]]]) -> Dict[str, Any]:
    """The user's copies of pinned files (stack_local_artifacts), each hashed (through the memo: a file unchanged
    since its last read is not read again) and compared with its pin: {"ok", "checked", "errors"}, one line per
    file that differs or cannot be read, naming the setting, the path, both sums and where the pin comes from."""
    errors: List[str] = []
    for pin in pins:
        path = Path(pin["path"])
        got = cached_sha256(path, "local:" + str(path.resolve()), memo) if path.exists() else ""
        if not got:
            errors.append(f"{pin['setting']}: '{pin['path']}' is not a readable file on the controller.")
        elif got != pin["sha256"]:
            errors.append(
                f"{pin['setting']}: '{pin['path']}' has sha256 {got}, but {pin['file']} is pinned to {pin['sha256']} "
                f"by {pin['pin']}; allowed: the file with that sum (download it again), or your file's sum in "
                "stack_artifact_checksums if you trust it."
            )
    return {"ok": not errors, "checked": [p["file"] for p in pins], "errors": errors}


def cache_dir_error(folder: str) -> str:
    """'' when the controller can create `folder` and write in it (it is created), else one line that names the
    setting, the folder and the reason."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test."):
            pass
    except OSError as exc:
        return (
            f"stack_artifact_cache_dir: '{folder}' cannot be created or written on the controller "
            f"({exc.strerror or exc}); allowed: a folder the user running ansible-playbook can write, or '' "
            "(each host downloads its own files)."
        )
    return ""


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default="", help="the cache folder on the controller")
    parser.add_argument(
        "--check-local",
        action="store_true",
        help="read a JSON list of {file, path, sha256, pin, setting} on stdin (the user's copies of pinned files) "
        "and check each copy's sha256 against its pin; with --cache, also that the cache folder can be created and "
        "written (the preflight's check), and the memo of sums is kept there",
    )
    parser.add_argument("--manifest", help="JSON list of files (- for stdin)")
    parser.add_argument("--offline", action="store_true", help="fetch nothing; report what is missing")
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--delay", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a try fails")
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--wheelhouse", help="fill this folder with wheels (see --requirement)")
    parser.add_argument("--requirement", action="append", default=[])
    parser.add_argument("--exclude", action="append", default=[], help="a wheel not to keep in the wheelhouse")
    parser.add_argument("--python-tag", default="cp38")
    parser.add_argument(
        "--wheelhouses",
        help="with a manifest: JSON list of {dir, requirements, python_tag}; the result's wheelhouses_ready "
        "lists the dirs already filled for them (nothing is fetched for these)",
    )
    args = parser.parse_args(argv)
    if args.check_local:
        pins = json.loads(sys.stdin.read())
        unusable = cache_dir_error(args.cache) if args.cache else ""
        if not args.cache or unusable:  # no cache folder (or not one to write): every copy is read
            result = check_local(pins, None)
        else:
            with locked(Path(args.cache)):  # the memo is the fillers' too
                memo = load_memo(Path(args.cache))
                result = check_local(pins, memo)
                save_memo(Path(args.cache), memo)
        if unusable:
            result["errors"].insert(0, unusable)
            result["ok"] = False
        print(json.dumps(result, indent=2, sort_keys=True))
        for line in result["errors"]:
            print(line, file=sys.stderr)
        return 0 if result["ok"] else 1
    if not args.cache:
        parser.error("--cache is required (the cache folder on the controller)")
    cache = Path(args.cache)
    global PROGRESS_LOG
    cache.mkdir(parents=True, exist_ok=True)
    PROGRESS_LOG = cache / ".fetch.log"
    if args.wheelhouse:
        with locked(cache):
            result = wheelhouse(
                Path(args.wheelhouse),
                args.requirement,
                args.python_tag,
                # From the environment, never the command line: a mirror's URL may carry a password.
                os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple"),
                args.offline,
                args.exclude,
            )
        message = result.get("error", "")
    else:
        text = sys.stdin.read() if args.manifest in (None, "-") else Path(args.manifest).read_text()
        result = fill(json.loads(text), cache, args.offline, args.retries, args.delay, args.timeout)
        message = explain(result, args.offline)
        if args.wheelhouses is not None:
            result["wheelhouses_ready"] = [
                house["dir"]
                for house in json.loads(args.wheelhouses)
                if wheelhouse_ready(Path(house["dir"]), house["requirements"], house["python_tag"])
            ]
    document = json.dumps(result, indent=2, sort_keys=True)
    if args.json:
        Path(args.json).write_text(document + "\n")
    print(document)
    if message:
        print(message, file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
