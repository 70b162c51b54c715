"""A loopback HTTP mirror that serves the fixtures (testbed/fixtures.py) read-only.

Sandbox containers share the controller's network namespace, so a server on 127.0.0.1 here is
reachable from them. The mirror counts GET requests per path, so a test can prove that a second
converge downloaded nothing.

    with serving(build_mirror()) as mirror:
        inventory_vars(root, mirror.base_url)      # stack_sources + checksums for the inventory
        mirror.counts["/nvidia_developer/compute/..."]

    python -m testbed.mirror .cache/mirror --port 8000   # serve in the foreground (debugging)
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

HOST = "127.0.0.1"


@dataclass
class Mirror:
    """A running mirror: its base URL and how often each path was requested (GET)."""

    root: Path
    base_url: str
    counts: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, path: str) -> None:
        with self._lock:
            self.counts[path] = self.counts.get(path, 0) + 1

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
        self.mirror.record(unquote(urlsplit(self.path).path))
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read their own output
        pass


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fixture mirror on 127.0.0.1 until Ctrl-C or SIGTERM.")
    parser.add_argument("root", type=Path, help="folder to serve (e.g. .cache/mirror)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with serving(args.root, args.port) as mirror:
        print(f"serving {mirror.root} at {mirror.base_url} (Ctrl-C to stop)", flush=True)
        stop.wait()
    for path, count in sorted(mirror.counts.items()):
        print(f"{count:>5} GET {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
