"""A loopback HTTP mirror that serves the fixtures (testbed/fixtures.py) read-only.

Sandbox containers share the controller's network namespace, so a server on 127.0.0.1 here is
reachable from them. The mirror counts GET requests per path, so a test can prove that a second
converge downloaded nothing, and it injects faults per path for the fault tests:

    mirror.inject("nvidia_developer/.../x.run", "truncate", times=2)   # the next 2 GETs are cut
    mirror.inject("nvidia_developer/.../x.run", "down")                # every GET answers 503

Faults: "down" (503 Service Unavailable), "truncate" (the full Content-Length is announced, half the
body is sent, then the connection is closed: a download cut mid-way), "corrupt" (the full length,
with bytes in the middle changed: a checksum mismatch), "slow" (the whole file at 32 MiB/s, so a
test can interrupt a download while it runs).

    with serving(build_mirror()) as mirror:
        inventory_vars(root, mirror.base_url)      # stack_sources + checksums for the inventory
        mirror.counts["/nvidia_developer/compute/..."]

    python -m testbed.mirror .cache/mirror --port 8000   # serve in the foreground (debugging)
    python -m testbed.mirror .cache/mirror --ensure http://127.0.0.1:8000
        # serve in the background unless that URL already answers (a molecule scenario run alone:
        # molecule/common/prepare.yml); the background server exits after --idle-exit seconds without a
        # request (30 minutes unless given)
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

HOST = "127.0.0.1"
FAULTS = ("down", "truncate", "corrupt", "slow")
SLOW_BYTES_PER_SECOND = 32 * 1024 * 1024


@dataclass
class Mirror:
    """A running mirror: its base URL and how often each path was requested (GET)."""

    root: Path
    base_url: str
    counts: dict[str, int] = field(default_factory=dict)
    # time.monotonic() of the last request (a background server's idle exit)
    last_request: float = field(default_factory=time.monotonic)
    # Bytes of the complete (fault-free) responses, for "bytes fetched from upstream".
    bytes_sent: int = 0
    # path -> queue of [fault, GETs left to fail (None: every one)], the head applies first
    faults: dict[str, list[list[Any]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, path: str) -> str:
        """Count a GET; returns the fault to inject into this response ("" for none)."""
        with self._lock:
            self.counts[path] = self.counts.get(path, 0) + 1
            self.last_request = time.monotonic()
            queue = self.faults.get(path)
            if not queue:
                return ""
            fault = queue[0]
            if fault[1] is not None:
                fault[1] -= 1
                if fault[1] <= 0:
                    queue.pop(0)
            return fault[0]

    def inject(self, relative: str, fault: str, times: int | None = None) -> None:
        """Make the next `times` GETs of a file (every GET when None) fail with `fault`, after the
        faults injected for it before."""
        if fault not in FAULTS:
            raise ValueError(f"fault '{fault}' is unknown; allowed: {', '.join(FAULTS)}")
        with self._lock:
            self.faults.setdefault("/" + relative.lstrip("/"), []).append([fault, times])

    def heal(self) -> None:
        """Remove every injected fault."""
        with self._lock:
            self.faults.clear()

    def url(self, relative: str) -> str:
        """The URL of a file below the mirror root, e.g. url('nvidia_developer/compute/...')."""
        return f"{self.base_url}/{relative.lstrip('/')}"

    def fetches(self, relative: str) -> int:
        """GET requests so far for a file below the mirror root."""
        with self._lock:
            return self.counts.get("/" + relative.lstrip("/"), 0)


class _Handler(SimpleHTTPRequestHandler):
    """Serves files below the root; only GET and HEAD exist (SimpleHTTPRequestHandler answers 501 else)."""

    mirror: Mirror

    def __init__(self, *args: Any, mirror: Mirror, **kwargs: Any) -> None:
        self.mirror = mirror
        super().__init__(*args, directory=str(mirror.root), **kwargs)

    def do_GET(self) -> None:
        fault = self.mirror.record(unquote(urlsplit(self.path).path))
        if fault == "down":
            self.send_error(503, "mirror down (injected fault)")
            return
        if not fault:
            super().do_GET()
            served = Path(self.translate_path(self.path))
            if served.is_file():
                with self.mirror._lock:
                    self.mirror.bytes_sent += served.stat().st_size
            return
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        with path.open("rb") as source:
            if fault == "slow":
                while chunk := source.read(SLOW_BYTES_PER_SECOND // 8):
                    self.wfile.write(chunk)
                    time.sleep(0.125)
                return
            if fault == "truncate":
                shutil.copyfileobj(_Limited(source, size // 2), self.wfile)
                self.close_connection = True
                return
            middle = size // 2
            shutil.copyfileobj(_Limited(source, middle), self.wfile)
            chunk = source.read(16)
            self.wfile.write(bytes(b ^ 0xFF for b in chunk))
            shutil.copyfileobj(source, self.wfile)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read their own output
        pass


class _Limited:
    """The first `limit` bytes of a binary file object."""

    def __init__(self, source: Any, limit: int) -> None:
        self.source, self.left = source, limit

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = self.source.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(data)
        return data


@contextmanager
def serving(root: Path, port: int = 0) -> Iterator[Mirror]:
    """Serve `root` on 127.0.0.1 (a free port unless `port` is given) in a daemon thread."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"mirror root {root} is not a directory")
    mirror = Mirror(root=root, base_url="")
    server = ThreadingHTTPServer((HOST, port), functools.partial(_Handler, mirror=mirror))
    server.daemon_threads = True
    mirror.base_url = f"http://{HOST}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name=f"mirror-{mirror.base_url}", daemon=True)
    thread.start()
    try:
        yield mirror
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def answers(url: str) -> bool:
    """Whether an HTTP server answers at `url` (any status counts)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=3):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def ensure(root: Path, url: str, idle_exit: int = 1800) -> str:
    """Serve `root` at `url` (http://127.0.0.1:PORT) in a background process unless a server already answers
    there; that process exits after `idle_exit` seconds without a request. Returns what it did."""
    parts = urlsplit(url)
    if parts.hostname != HOST or not parts.port:
        raise ValueError(f"--ensure: '{url}' is not a URL on {HOST} with a port; allowed: http://{HOST}:PORT")
    if answers(url):
        return f"{url} already answers"
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"mirror root {root} is not a directory (run ./toolkit setup first)")
    log = root.parent / "mirror-background.log"
    with log.open("ab") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "testbed.mirror",
                str(root),
                "--port",
                str(parts.port),
                "--idle-exit",
                str(idle_exit),
            ],
            cwd=Path(__file__).resolve().parents[1],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,  # outlives the playbook that started it
        )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if answers(url):
            return f"started a background mirror (pid {process.pid}) at {url}, serving {root}"
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the background mirror for {url} did not start (port taken?); see {log}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fixture mirror on 127.0.0.1 until Ctrl-C or SIGTERM.")
    parser.add_argument("root", type=Path, help="folder to serve (e.g. .cache/mirror)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--idle-exit", type=int, default=0, help="exit after this many seconds without a request")
    parser.add_argument("--ensure", metavar="URL", default="", help="serve at URL in the background unless it answers")
    args = parser.parse_args(argv)
    if args.ensure:
        try:
            print(ensure(args.root, args.ensure, args.idle_exit or 1800))
        except (ValueError, OSError, RuntimeError) as exc:
            print(f"mirror: {exc}", file=sys.stderr)
            return 1
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with serving(args.root, args.port) as mirror:
        print(f"serving {mirror.root} at {mirror.base_url} (pid {os.getpid()}; Ctrl-C to stop)", flush=True)
        while not stop.wait(5):
            if args.idle_exit and time.monotonic() - mirror.last_request > args.idle_exit:
                print(f"no request for {args.idle_exit} s: stopping", flush=True)
                break
    for path, count in sorted(mirror.counts.items()):
        print(f"{count:>5} GET {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
