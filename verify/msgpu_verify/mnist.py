"""Prepare MNIST in the layout MindSpore's MnistDataset reads: DEST/train/* and DEST/test/*.

A source is a folder with raw or gzipped IDX files (flat, or already in train/ and test/), a file:// URL of
such a folder, or an http(s) base URL from which the four ``.gz`` files are downloaded. Several sources are
tried IN ORDER, file by file: the official mirror, other mirrors, a local copy last. Every file is checked
against sha256 before use: the ``.gz`` as a mirror publishes it (``NAME.gz``), or its decompressed content
(``NAME``), so a copy gzipped again still passes, and anything else never does.

An unreachable source (its name does not resolve, the connection is refused, no route, no answer to the
connect within ``connect_timeout_s``) is given up at once and skipped for the remaining files: no retries.
Only a transfer that breaks off (a timeout or reset mid-transfer, a short body, HTTP 5xx/408/429) is tried
again, ``retries`` times. When no source has a file, the error lists every source with its reason and
names the two settings that fix it (``HINT``).

``prepare`` builds the layout (on each host); ``fetch`` fills a cache folder with the four files as they
are (the controller's copy for all hosts). Command line (``--source`` repeatable, in order)::

    python -m msgpu_verify.mnist fetch   --dest CACHE --source URL_OR_FOLDER ... --sha256-file SUMS [--offline]
    python -m msgpu_verify.mnist prepare --dest DATA  --source URL_OR_FOLDER ... --sha256-file SUMS

Standard library only; Python 3.8.
"""

from __future__ import annotations

import argparse
import errno
import gzip
import http.client
import json
import os
import shutil
import socket
import ssl
import struct
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ._args import bounded
from ._digest import sha256_of

# name -> (subfolder, IDX magic, item count, bytes per item)
FILES: Dict[str, Tuple[str, int, int, int]] = {
    "train-images-idx3-ubyte": ("train", 0x00000803, 60000, 28 * 28),
    "train-labels-idx1-ubyte": ("train", 0x00000801, 60000, 1),
    "t10k-images-idx3-ubyte": ("test", 0x00000803, 10000, 28 * 28),
    "t10k-labels-idx1-ubyte": ("test", 0x00000801, 10000, 1),
}
CHUNK = 1 << 20
# What fixes a failed fetch, in the settings of this project's Ansible roles.
HINT = (
    "Point stack_sources.mnist at a mirror this machine can reach (an http(s):// or file:// URL of a folder "
    "with the four .gz files), or set verify_mnist_local_path to a folder on the controller that holds them "
    "(this repository's own copy: data/mnist)."
)
Sources = Union[str, Sequence[str]]


class MnistError(Exception):
    """A source, checksum or file-format problem, in words that name the file."""


class SourceFailed(Exception):
    """One source could not give one file. ``unreachable``: skip the source for the other files too."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def content_sha256(path: Path) -> str:
    """sha256 of the file's content: decompressed when it is a ``.gz``."""
    if not path.name.endswith(".gz"):
        return sha256_of(path)
    try:
        return sha256_of(path, gzip.open)
    except (OSError, EOFError) as exc:
        raise MnistError(f"{path.name}: not a readable gzip file ({exc})") from exc


def parse_sha256sums(text: str) -> Dict[str, str]:
    """``sha256sum`` output (``HEX  name`` or ``HEX *name``) as {basename: hex}."""
    sums: Dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and len(parts[0]) == 64:
            sums[os.path.basename(parts[1].lstrip("*").strip())] = parts[0].lower()
    return sums


def validate_idx(path: Path, name: str) -> None:
    """Raise MnistError unless ``path`` is the raw IDX file ``name`` with the right magic, shape and size."""
    _, magic, count, item = FILES[name]
    header_len = 16 if magic == 0x00000803 else 8
    try:
        size = path.stat().st_size
        with open(str(path), "rb") as handle:
            header = handle.read(header_len)
            labels = handle.read() if magic == 0x00000801 else b""
    except OSError as exc:
        raise MnistError(f"{name}: cannot read {path}: {exc}") from exc
    if len(header) < header_len:
        raise MnistError(f"{name}: {path} is too short to be an IDX file")
    got_magic, got_count = struct.unpack(">II", header[:8])
    if got_magic != magic:
        raise MnistError(f"{name}: bad IDX magic 0x{got_magic:08x} in {path} (expected 0x{magic:08x})")
    if got_count != count:
        raise MnistError(f"{name}: {path} holds {got_count} items, expected {count}")
    if magic == 0x00000803 and struct.unpack(">II", header[8:16]) != (28, 28):
        raise MnistError(f"{name}: images in {path} are not 28x28")
    if size != header_len + count * item:
        raise MnistError(f"{name}: {path} is {size} bytes, expected {header_len + count * item}")
    if labels and max(labels) > 9:
        raise MnistError(f"{name}: {path} has labels outside 0-9")


def target(dest: Path, name: str) -> Path:
    return dest / FILES[name][0] / name


def is_complete(dest: Path) -> bool:
    try:
        for name in FILES:
            validate_idx(target(dest, name), name)
    except MnistError:
        return False
    return True


def find_local(source: Path, name: str) -> Optional[Path]:
    sub = FILES[name][0]
    for folder in (source / sub, source):
        for candidate in (folder / name, folder / (name + ".gz")):
            if candidate.is_file():
                return candidate
    return None


def idx_name(file_name: str) -> str:
    return file_name[:-3] if file_name.endswith(".gz") else file_name


def pinned(name: str, checksums: Dict[str, str]) -> bool:
    """Whether the IDX file ``name`` has a pin: its ``.gz`` as published, or its content."""
    return name + ".gz" in checksums or name in checksums


def check_sum(path: Path, file_name: str, checksums: Dict[str, str], origin: str = "") -> None:
    """Accept ``path`` (named ``file_name`` at its source) when its own sha256 is pinned for that name, or
    its decompressed content's sha256 is pinned for the IDX name; nothing pinned: nothing to check."""
    expected = checksums.get(file_name)
    expected_content = checksums.get(idx_name(file_name)) if file_name.endswith(".gz") else None
    if expected is None and expected_content is None:
        return
    got = sha256_of(path)
    if expected is not None and got == expected.lower():
        return
    where = f" (from {origin})" if origin else ""
    if expected_content is not None:
        try:
            content = content_sha256(path)
        except MnistError as exc:
            content = f"unreadable: {exc}"
        if content == expected_content.lower():
            return
        raise MnistError(
            f"checksum mismatch for {file_name}{where}: sha256 {got}"
            + (f", expected {expected}" if expected else "")
            + f"; decompressed sha256 {content}, expected {expected_content}"
        )
    raise MnistError(f"checksum mismatch for {file_name}{where}: expected sha256 {expected}, got {got}")


def install(found: Path, name: str, dest: Path) -> None:
    """Decompress (or copy) ``found`` into place through a temp file, validated before the rename."""
    final = target(dest, name)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix="." + name + ".", dir=str(final.parent))
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            opener = gzip.open if found.name.endswith(".gz") else open
            try:
                with opener(str(found), "rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
            except (OSError, EOFError) as exc:
                raise MnistError(f"{name}: cannot decompress {found}: {exc}") from exc
        validate_idx(tmp, name)
        os.chmod(str(tmp), 0o644)
        os.replace(str(tmp), str(final))
    finally:
        if tmp.exists():
            tmp.unlink()


def ssl_context(ca_bundle: Optional[str]) -> ssl.SSLContext:
    bundle = ca_bundle or os.environ.get("SSL_CERT_FILE") or os.environ.get("REQUESTS_CA_BUNDLE")
    return ssl.create_default_context(cafile=bundle) if bundle else ssl.create_default_context()


def log(message: str) -> None:
    print(f"mnist: {message}", file=sys.stderr, flush=True)


# --- downloads -------------------------------------------------------------------------------------
UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}


def _unreachable_reason(reason: object, connect_timeout_s: float) -> Optional[str]:
    """Why a connection could not be opened at all, or None when the failure may pass (worth a retry)."""
    if isinstance(reason, socket.gaierror):
        return f"its name does not resolve ({reason})"
    if isinstance(reason, ConnectionRefusedError):
        return "the connection was refused"
    if isinstance(reason, socket.timeout):
        return f"no answer to the connection within {connect_timeout_s:.0f} s"
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"its TLS certificate is not trusted ({reason.verify_message}; verify_ca_bundle sets the CA bundle)"
    if isinstance(reason, OSError) and reason.errno in UNREACHABLE_ERRNOS:
        return f"{os.strerror(reason.errno or 0).lower()}"
    return None


def download(
    url: str,
    path: Path,
    timeout_s: float = 60.0,
    retries: int = 3,
    ca_bundle: Optional[str] = None,
    connect_timeout_s: float = 15.0,
) -> int:
    """Fetch ``url`` to ``path`` through a temp file next to it; return its size.

    Raises SourceFailed: ``unreachable`` at once when no connection can be opened; after ``retries`` tries
    when the transfer keeps breaking off; at once on any other HTTP error (the file is not there).
    """
    last_error = ""
    tries = max(1, retries)
    for attempt in range(1, tries + 1):
        fd, tmp_name = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".part", dir=str(path.parent))
        tmp = Path(tmp_name)
        received = 0
        try:
            context = ssl_context(ca_bundle) if url.startswith("https:") else None
            try:
                response = urllib.request.urlopen(url, timeout=min(connect_timeout_s, timeout_s), context=context)
            except urllib.error.HTTPError as exc:
                if exc.code >= 500 or exc.code in (408, 429):
                    raise  # transient: retried below
                raise SourceFailed(f"HTTP {exc.code} {exc.reason}") from exc
            except urllib.error.URLError as exc:
                why = _unreachable_reason(exc.reason, min(connect_timeout_s, timeout_s))
                if why is not None:
                    raise SourceFailed(f"unreachable: {why}", unreachable=True) from exc
                raise
            with response, os.fdopen(fd, "wb") as out:
                fd = -1
                # The connection is open: from here on each read may take the full transfer timeout.
                raw = getattr(getattr(response, "fp", None), "raw", None)
                sock = getattr(raw, "_sock", None)
                if sock is not None:
                    sock.settimeout(timeout_s)
                total = int(response.headers.get("Content-Length") or 0)
                block = response.read(CHUNK)
                while block:
                    out.write(block)
                    received += len(block)
                    block = response.read(CHUNK)
            if total and received < total:
                raise http.client.IncompleteRead(b"", total - received)
            os.replace(str(tmp), str(path))
            return received
        except SourceFailed:
            raise
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            last_error = f"{type(exc).__name__}: {exc}" + (f" after {received} bytes" if received else "")
            if attempt < tries:
                log(f"  {path.name}: try {attempt} of {tries} broke off ({last_error}); trying again")
                time.sleep(min(2.0 * attempt, 5.0))
        finally:
            if fd != -1:
                os.close(fd)
            if tmp.exists():
                tmp.unlink()
    raise SourceFailed(f"the transfer failed {tries} times, last: {last_error}")


# --- sources in order ----------------------------------------------------------------------------------
def source_list(sources: Sources) -> List[str]:
    items = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    found = [str(s).strip() for s in items if str(s).strip()]
    if not found:
        raise MnistError(f"no MNIST source given. {HINT}")
    return found


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def redact(source: str) -> str:
    """``source`` fit for a message: a URL without its user:password@ part."""
    if not is_url(source):
        return source
    parts = urllib.parse.urlsplit(source)
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()


def local_folder(source: str) -> Path:
    if source.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(source).path))
    return Path(source)


class _Fetcher:
    """Gets one IDX file at a time from the sources in order, checked; remembers unreachable sources."""

    def __init__(
        self,
        sources: Sources,
        checksums: Dict[str, str],
        ca_bundle: Optional[str],
        timeout_s: float,
        retries: int,
        connect_timeout_s: float,
        offline: bool = False,
    ) -> None:
        self.sources = source_list(sources)
        self.checksums = checksums
        self.ca_bundle = ca_bundle
        self.timeout_s = timeout_s
        self.retries = retries
        self.connect_timeout_s = connect_timeout_s
        self.offline = offline
        self.dead: Dict[str, str] = {}
        self.used: Dict[str, str] = {}
        # Sources that could not give a file, and why (shown when a later source could).
        self.passed_over: Dict[str, str] = {}

    def get(self, name: str, staging: Path) -> Path:
        """A checked copy of ``name`` (or ``name.gz``): the local file itself, or a download into ``staging``."""
        tried: List[str] = []
        for source in self.sources:
            shown = redact(source)
            if source in self.dead:
                tried.append(f"{shown}: skipped, {self.dead[source]} (see above)")
                continue
            started = time.monotonic()
            try:
                found = self._from(source, shown, name, staging)
            except SourceFailed as exc:
                seconds = time.monotonic() - started
                tried.append(f"{shown}: {exc} ({seconds:.1f} s)")
                self.passed_over.setdefault(shown, f"{exc} ({seconds:.1f} s)")
                if exc.unreachable:
                    self.dead[source] = str(exc)
                continue
            self.used[name] = shown
            return found
        raise MnistError(
            f"{name}: no MNIST source could give it; tried in order:\n"
            + "\n".join(f"  - {line}" for line in tried)
            + f"\n{HINT}"
        )

    def _from(self, source: str, shown: str, name: str, staging: Path) -> Path:
        if not is_url(source):
            folder = local_folder(source)
            found = find_local(folder, name) if folder.is_dir() else None
            if found is None:
                why = (
                    f"holds neither {name} nor {name}.gz"
                    if folder.is_dir()
                    else "is neither a folder nor an http(s) URL"
                )
                raise SourceFailed(why)
            self._check(found, found.name, shown)
            return found
        if self.offline:
            raise SourceFailed("skipped: offline (stack_offline), only local folders are used", unreachable=True)
        file_name = name + ".gz"
        if not pinned(name, self.checksums):
            # A configuration error, not a source's: no other source would be trusted either.
            raise MnistError(
                f"no sha256 for {file_name}: downloads are only used when pinned (--sha256-file or --sha256)"
            )
        staging.mkdir(parents=True, exist_ok=True)
        path = staging / file_name
        url = source.rstrip("/") + "/" + file_name
        size = download(url, path, self.timeout_s, self.retries, self.ca_bundle, self.connect_timeout_s)
        try:
            self._check(path, file_name, url)
        except SourceFailed:
            path.unlink()
            raise
        log(f"{file_name}: {size} bytes from {shown}, sha256 ok")
        return path

    def _check(self, path: Path, file_name: str, origin: str) -> None:
        try:
            check_sum(path, file_name, self.checksums, origin)
        except MnistError as exc:
            raise SourceFailed(str(exc)) from exc


def prepare(
    source: Sources,
    dest: str,
    checksums: Optional[Dict[str, str]] = None,
    ca_bundle: Optional[str] = None,
    timeout_s: float = 60.0,
    retries: int = 3,
    connect_timeout_s: float = 15.0,
) -> Path:
    """Make ``dest`` hold the four validated IDX files; return ``dest``. Does nothing if already complete.

    ``source``: one source or several, tried in order for each file (see the module's docstring).
    """
    checksums = {k: v.lower() for k, v in (checksums or {}).items()}
    dest_path = Path(dest)
    if is_complete(dest_path):
        return dest_path
    fetcher = _Fetcher(source, checksums, ca_bundle, timeout_s, retries, connect_timeout_s)
    staging = dest_path / ".download"
    try:
        for name in FILES:
            final = target(dest_path, name)
            if final.is_file():
                try:
                    validate_idx(final, name)
                    check_sum(final, name, checksums)
                    continue  # already in place (a source that is the layout itself, or an earlier run)
                except MnistError:
                    pass
            found = fetcher.get(name, staging)
            install(found, name, dest_path)
            if found.parent == staging:
                found.unlink()
    finally:
        shutil.rmtree(str(staging), ignore_errors=True)
    return dest_path


def cached(dest: Path, name: str, checksums: Dict[str, str]) -> Optional[Path]:
    """The checked copy of ``name`` (``name.gz`` or raw) in the cache folder ``dest``; a bad one is removed."""
    keep: Optional[Path] = None
    for path in (dest / (name + ".gz"), dest / name):
        if not path.is_file():
            continue
        try:
            check_sum(path, path.name, checksums)
        except MnistError as exc:
            log(f"{path.name} in {dest} is not the pinned file, fetching it again: {exc}")
            path.unlink()
            continue
        if keep is None:
            keep = path
        else:
            path.unlink()  # one copy per file: the hosts get every *-ubyte* file of the folder
    return keep


def fetch(
    sources: Sources,
    dest: str,
    checksums: Dict[str, str],
    ca_bundle: Optional[str] = None,
    timeout_s: float = 60.0,
    retries: int = 3,
    offline: bool = False,
    connect_timeout_s: float = 15.0,
) -> Dict[str, object]:
    """Make the cache folder ``dest`` hold the four files as they came (``.gz`` or raw), each checked.

    Every file must be pinned (the cache is what every host trusts). Returns what came from where.
    """
    checksums = {k: v.lower() for k, v in (checksums or {}).items()}
    missing = [name for name in FILES if not pinned(name, checksums)]
    if missing:
        raise MnistError(f"no sha256 for {', '.join(missing)}: the cache only holds pinned files")
    dest_path = Path(dest)
    dest_path.mkdir(parents=True, exist_ok=True)
    fetcher = _Fetcher(sources, checksums, ca_bundle, timeout_s, retries, connect_timeout_s, offline)
    staging = dest_path / ".download"
    came: Dict[str, str] = {}
    started = time.monotonic()
    try:
        for name in FILES:
            if cached(dest_path, name, checksums) is not None:
                continue
            found = fetcher.get(name, staging)
            final = dest_path / found.name
            fd, tmp_name = tempfile.mkstemp(prefix="." + found.name + ".", dir=str(dest_path))
            os.close(fd)
            try:
                shutil.copyfile(str(found), tmp_name)
                os.chmod(tmp_name, 0o644)
                os.replace(tmp_name, str(final))
            finally:
                if os.path.exists(tmp_name):
                    os.unlink(tmp_name)
            came[found.name] = fetcher.used[name]
    finally:
        shutil.rmtree(str(staging), ignore_errors=True)
    return {
        "ok": True,
        "changed": bool(came),
        "dest": str(dest_path),
        "fetched": came,
        "passed_over": fetcher.passed_over,
        "seconds": round(time.monotonic() - started, 2),
    }


# --- command line -----------------------------------------------------------------------------------
def checksums_from(sha256_files: List[str], items: List[str]) -> Dict[str, str]:
    sums: Dict[str, str] = {}
    for path in sha256_files:
        sums.update(parse_sha256sums(Path(path).read_text()))
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or len(value) != 64:
            raise MnistError(f"--sha256 wants NAME=HEX (64 hex digits), got {item!r}")
        sums[name] = value.lower()
    return sums


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m msgpu_verify.mnist", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        choices=["fetch", "prepare"],
        help="fetch: fill a cache folder with the four files; prepare: build DEST/train, DEST/test",
    )
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        required=True,
        help="http(s) base URL, file:// URL or folder; repeatable, tried in this order",
    )
    parser.add_argument("--dest", required=True)
    parser.add_argument("--sha256-file", action="append", default=[], help="sha256sum-style file (repeatable)")
    parser.add_argument("--sha256", action="append", default=[], metavar="NAME=HEX")
    parser.add_argument("--ca-bundle")
    parser.add_argument(
        "--timeout", type=bounded("--timeout", float, 1, 86400), default=60.0, help="seconds a transfer may stall"
    )
    parser.add_argument(
        "--connect-timeout",
        type=bounded("--connect-timeout", float, 1, 600),
        default=15.0,
        help="seconds to open a connection",
    )
    parser.add_argument(
        "--retries",
        type=bounded("--retries", int, 0, 100),
        default=3,
        help="tries of a transfer that breaks off (0: one try)",
    )
    parser.add_argument("--offline", action="store_true", help="fetch: use local folders only")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        sums = checksums_from(args.sha256_file, args.sha256)
        if args.command == "fetch":
            document = fetch(
                args.source,
                args.dest,
                sums,
                args.ca_bundle,
                args.timeout,
                args.retries,
                args.offline,
                args.connect_timeout,
            )
        else:
            before = is_complete(Path(args.dest))
            dest = prepare(
                args.source, args.dest, sums, args.ca_bundle, args.timeout, args.retries, args.connect_timeout
            )
            document = {"ok": True, "changed": not before, "dest": str(dest)}
    except (MnistError, OSError) as exc:
        seconds = time.monotonic() - started
        print(json.dumps({"ok": False, "error": str(exc), "seconds": round(seconds, 2)}))
        print(f"mnist: ERROR after {seconds:.1f} s: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(document, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
