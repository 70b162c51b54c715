#!/usr/bin/env python3
"""Start a MindSpore Serving server for the servables of one folder (runs on the host).

    msgpu_serving_server.py --servables-dir DIR [--servable NAME ...] --grpc-address HOST:PORT
                            [--restful-address HOST:PORT] [--device-ids 0,1] [--device-type GPU]
                            [--work-dir DIR]

A servable is a folder DIR/<name>/ with a servable_config.py and one version folder per model
version (DIR/<name>/1/ holding the MindIR file). Without --servable, every subfolder of DIR with a
servable_config.py is started. The server listens for gRPC (and RESTful with --restful-address)
until SIGTERM or SIGINT, then stops its workers and exits 0.

Exit status (the systemd unit does not restart on 2, 3 and 4: a restart cannot fix them):
  0  stopped by SIGTERM/SIGINT
  1  the server stopped by itself (every worker process exited); see <work-dir>/serving_logs
  2  bad configuration: a servable is missing, DIR holds none, an address is malformed
  3  mindspore_serving cannot be imported in this interpreter
  4  the device is not supported here (no GPU/Ascend visible, or device type not available)
  5  the server did not start for another reason (a port in use, a servable_config.py error, ...)

Host Python 3.8, standard library plus mindspore_serving (the MindSpore virtualenv).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from typing import List, Optional, Sequence

EXIT_STOPPED = 0
EXIT_DIED = 1
EXIT_CONFIG = 2
EXIT_IMPORT = 3
EXIT_DEVICE = 4
EXIT_START = 5

ADDRESS = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$")
# What Serving says when the device (or its inference backend) is not there: "Not support device
# type None(Default) and model type MindIR ...", "Failed to get device type", "The device type 'gpu'
# ... is inconsistent with current running environment".
DEVICE_ERRORS = re.compile(r"not support device type|failed to get device type|inconsistent with current running", re.I)


def say(message: str) -> None:
    print(f"msgpu-serving: {message}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servables-dir", required=True, help="folder with one subfolder per servable")
    parser.add_argument("--servable", action="append", default=[], help="servable to start (repeat); default: all")
    parser.add_argument("--grpc-address", required=True, help="HOST:PORT or unix:/path for the gRPC server")
    parser.add_argument("--restful-address", default="", help="HOST:PORT for the RESTful server (off when empty)")
    parser.add_argument("--device-ids", default="0", help="comma-separated device ids each servable runs on")
    parser.add_argument("--device-type", default="", help="GPU, Ascend or CPU; empty: what the backend supports")
    parser.add_argument("--work-dir", default="", help="folder for serving_logs/ and unix_socket_files/")
    return parser.parse_args(list(argv))


def address_problem(name: str, value: str, unix_allowed: bool) -> Optional[str]:
    if unix_allowed and value.startswith("unix:"):
        return None if value[len("unix:") :].startswith("/") else f"{name} '{value}': unix: needs an absolute path"
    match = ADDRESS.match(value)
    if not match or not 1 <= int(match.group(1)) <= 65535:
        allowed = "HOST:PORT (port 1-65535)" + (" or unix:/absolute/path" if unix_allowed else "")
        return f"{name} '{value}' is malformed; allowed: {allowed}"
    return None


def device_ids(value: str) -> List[int]:
    ids = [part.strip() for part in value.split(",") if part.strip()]
    if not ids or not all(part.isdigit() for part in ids):
        raise ValueError(f"--device-ids '{value}': allowed: non-negative integers separated by commas, e.g. 0,1")
    return [int(part) for part in ids]


def find_servables(folder: str) -> List[str]:
    """Subfolders of `folder` with a servable_config.py, sorted."""
    return sorted(
        name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name, "servable_config.py"))
    )


def servable_problems(folder: str, names: Sequence[str]) -> List[str]:
    """Why each named servable cannot start: no folder, no servable_config.py, no version folder."""
    problems = []
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isdir(path):
            problems.append(f"servable '{name}': {path} does not exist")
        elif not os.path.isfile(os.path.join(path, "servable_config.py")):
            problems.append(f"servable '{name}': {path}/servable_config.py does not exist")
        elif not any(entry.isdigit() and os.path.isdir(os.path.join(path, entry)) for entry in os.listdir(path)):
            problems.append(f"servable '{name}': {path} has no version folder (1/, 2/, ...) for its model")
    return problems


def choose_servables(folder: str, wanted: Sequence[str]) -> List[str]:
    """The servables to start, or SystemExit(EXIT_CONFIG) naming what is missing."""
    if not os.path.isdir(folder):
        say(f"servables folder {folder} does not exist (serving_servables_dir)")
        raise SystemExit(EXIT_CONFIG)
    names = list(dict.fromkeys(wanted)) or find_servables(folder)
    if not names:
        say(
            f"no servable in {folder}: put each one in {folder}/<name>/ with a servable_config.py and its model "
            "in a version folder <name>/1/, or name them in serving_servables"
        )
        raise SystemExit(EXIT_CONFIG)
    problems = servable_problems(folder, names)
    if problems:
        found = find_servables(folder)
        say("; ".join(problems) + f" (serving_servables; servables found in {folder}: {', '.join(found) or 'none'})")
        raise SystemExit(EXIT_CONFIG)
    return names


def start(args: argparse.Namespace, names: Sequence[str], ids: Sequence[int]):
    """Start the servables and the servers; returns the server module. Exits with a status on failure."""
    try:
        from mindspore_serving import server
    except ImportError as error:  # a missing libpython3.8.so.1.0, libgomp.so.1 or the package itself
        say(f"cannot import mindspore_serving.server with {sys.executable}: {error}")
        raise SystemExit(EXIT_IMPORT) from error

    configs = [
        server.ServableStartConfig(
            servable_directory=args.servables_dir,
            servable_name=name,
            device_ids=list(ids),
            device_type=args.device_type or None,
        )
        for name in names
    ]
    try:
        server.start_servables(configs)
    except RuntimeError as error:
        if "because of signal SIGINT or SIGTERM" in str(error):
            # Serving's own handler caught the signal while the workers were starting.
            say("stopped by SIGTERM/SIGINT while the servables were starting")
            raise SystemExit(EXIT_STOPPED) from error
        if DEVICE_ERRORS.search(str(error)):
            say(
                f"the device is not supported here (device ids {','.join(map(str, ids))}, device type "
                f"{args.device_type or 'auto'}): {error}. MindSpore Serving runs MindIR models on a GPU (with the "
                "MindSpore backend) or Ascend; check nvidia-smi, serving_device_ids and serving_device_type"
            )
            raise SystemExit(EXIT_DEVICE) from error
        say(f"starting servables {', '.join(names)} failed: {error} (logs in {os.getcwd()}/serving_logs)")
        raise SystemExit(EXIT_START) from error
    try:
        server.start_grpc_server(args.grpc_address)
        if args.restful_address:
            server.start_restful_server(args.restful_address)
    except RuntimeError as error:
        say(f"starting the gRPC/RESTful server failed: {error} (is the port in use?)")
        raise SystemExit(EXIT_START) from error
    return server


def serve(args: argparse.Namespace, names: Sequence[str], ids: Sequence[int]) -> int:
    before = set(threading.enumerate())
    server = start(args, names, ids)
    # Serving's own thread that watches the workers; when it ends without a signal, the server stopped.
    watchers = [t for t in threading.enumerate() if t not in before and not t.daemon]
    say(
        f"serving {', '.join(names)} from {args.servables_dir} on gRPC {args.grpc_address}"
        + (f", RESTful {args.restful_address}" if args.restful_address else "")
        + f" (pid {os.getpid()})"
    )

    # Installed after the start: Serving's start functions install their own SIGINT/SIGTERM handlers.
    stopping = threading.Event()
    received: List[int] = []

    def on_signal(signum: int, _frame) -> None:
        received.append(signum)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    while not stopping.wait(0.5):
        if watchers and not any(t.is_alive() for t in watchers):
            say(f"the server stopped by itself: every worker process exited (logs in {os.getcwd()}/serving_logs)")
            server.stop()
            return EXIT_DIED

    say(f"received {signal.Signals(received[0]).name}, stopping the servables and the servers")
    started = time.monotonic()
    server.stop()
    say(f"stopped in {time.monotonic() - started:.1f} s")
    return EXIT_STOPPED


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    args.servables_dir = os.path.abspath(args.servables_dir)
    problems = [
        problem
        for problem in (
            address_problem("--grpc-address (serving_grpc_address)", args.grpc_address, unix_allowed=True),
            address_problem("--restful-address (serving_restful_address)", args.restful_address, unix_allowed=False)
            if args.restful_address
            else None,
        )
        if problem
    ]
    try:
        ids = device_ids(args.device_ids)
    except ValueError as error:
        problems.append(str(error))
    if problems:
        say("; ".join(problems))
        return EXIT_CONFIG
    names = choose_servables(args.servables_dir, args.servable)
    if args.work_dir:
        # Serving writes serving_logs/ and unix_socket_files/ into the current directory.
        os.chdir(args.work_dir)
    return serve(args, names, ids)


if __name__ == "__main__":
    try:
        status = main(sys.argv[1:])
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else EXIT_CONFIG
    sys.stdout.flush()
    sys.stderr.flush()
    # Serving's C++ threads can keep the interpreter from exiting after stop(): leave at once.
    os._exit(status)
