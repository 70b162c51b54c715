"""Prepare MNIST in the layout MindSpore's MnistDataset reads: DEST/train/* and DEST/test/*.

Sources: a folder with raw or gzipped IDX files (flat, or already in train/ and test/), or an http(s)
base URL from which the four ``.gz`` files are downloaded and checked against sha256 before use.
Standard library only; Python 3.8.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import ssl
import struct
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Optional, Tuple

# name -> (subfolder, IDX magic, item count, bytes per item)
FILES: Dict[str, Tuple[str, int, int, int]] = {
    "train-images-idx3-ubyte": ("train", 0x00000803, 60000, 28 * 28),
    "train-labels-idx1-ubyte": ("train", 0x00000801, 60000, 1),
    "t10k-images-idx3-ubyte": ("test", 0x00000803, 10000, 28 * 28),
    "t10k-labels-idx1-ubyte": ("test", 0x00000801, 10000, 1),
}
CHUNK = 1 << 20


class MnistError(Exception):
    """A source, checksum or file-format problem, in words that name the file."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(str(path), "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


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


def check_sum(path: Path, file_name: str, checksums: Dict[str, str]) -> None:
    expected = checksums.get(file_name)
    if expected is None:
        return
    got = sha256_of(path)
    if got != expected.lower():
        raise MnistError(f"checksum mismatch for {file_name}: expected sha256 {expected}, got {got}")


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


def download(url: str, path: Path, expected: str, timeout_s: float, retries: int, ca_bundle: Optional[str]) -> None:
    """Fetch ``url`` to a temp file next to ``path``; rename only when its sha256 is ``expected``."""
    file_name = path.name
    last_error: Optional[str] = None
    for attempt in range(1, retries + 1):
        fd, tmp_name = tempfile.mkstemp(prefix="." + file_name + ".", dir=str(path.parent))
        tmp = Path(tmp_name)
        digest = hashlib.sha256()
        try:
            context = ssl_context(ca_bundle) if url.startswith("https:") else None
            with os.fdopen(fd, "wb") as out:
                response = urllib.request.urlopen(url, timeout=timeout_s, context=context)
                with response:
                    block = response.read(CHUNK)
                    while block:
                        digest.update(block)
                        out.write(block)
                        block = response.read(CHUNK)
            got = digest.hexdigest()
            if got != expected.lower():
                raise MnistError(
                    f"checksum mismatch for {file_name} (from {url}): expected sha256 {expected}, got {got}"
                )
            os.replace(str(tmp), str(path))
            return
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, urllib.error.HTTPError) and 400 <= exc.code < 500:
                break
            time.sleep(min(2.0 * attempt, 5.0))
        finally:
            if tmp.exists():
                tmp.unlink()
    raise MnistError(f"cannot download {file_name} from {url}: {last_error}")


def prepare(
    source: str,
    dest: str,
    checksums: Optional[Dict[str, str]] = None,
    ca_bundle: Optional[str] = None,
    timeout_s: float = 60.0,
    retries: int = 3,
) -> Path:
    """Make ``dest`` hold the four validated IDX files; return ``dest``. Does nothing if already complete."""
    checksums = {k: v.lower() for k, v in (checksums or {}).items()}
    dest_path = Path(dest)
    if is_complete(dest_path):
        return dest_path
    source_text = str(source)
    if source_text.startswith(("http://", "https://")):
        base = source_text.rstrip("/") + "/"
        staging = dest_path / ".download"
        staging.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            file_name = name + ".gz"
            if file_name not in checksums:
                raise MnistError(
                    f"no sha256 for {file_name}: downloads are only used when pinned (--sha256-file or --sha256)"
                )
            gz_path = staging / file_name
            if not (gz_path.is_file() and sha256_of(gz_path) == checksums[file_name]):
                download(base + file_name, gz_path, checksums[file_name], timeout_s, retries, ca_bundle)
            install(gz_path, name, dest_path)
        shutil.rmtree(str(staging), ignore_errors=True)
        return dest_path
    source_path = Path(source_text)
    if not source_path.is_dir():
        raise MnistError(f"MNIST source {source_text} is neither a folder nor an http(s) URL")
    for name in FILES:
        found = find_local(source_path, name)
        if found is None:
            raise MnistError(f"{name}: neither {name} nor {name}.gz found under {source_path}")
        if found.resolve() == target(dest_path, name).resolve():
            validate_idx(found, name)
            continue
        check_sum(found, found.name, checksums)
        install(found, name, dest_path)
    return dest_path
