"""roles/serving on a real Ubuntu 20.04 container: MindSpore Serving from PyPI in the MindSpore
virtualenv, the launcher really serving a servable over gRPC, the unit, idempotence, refusals of bad
input before any change, and removal.

The host has no GPU and no systemd (a container): MindIR models cannot run there, so the launcher is
proven with a servable whose method is a Python stage (Serving needs no device for it), and with a
real MindIR model that it must refuse with the device message and exit status 4.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from testbed import fingerprint
from tests.serving.conftest import (
    PROVISION_TAGS,
    SERVING,
    STACK,
    STACKS_WITHOUT_SERVING,
    PlaybookRun,
    ServingHost,
)

USER = "msgpu"
VERSION = str(STACK["serving"])
PACKAGE = SERVING["package"]
VENV = f"/home/{USER}/venvs/mindspore-{STACK['mindspore']}"
UNIT = "/etc/systemd/system/msgpu-serving.service"
LAUNCHER = "/usr/local/lib/msgpu/msgpu_serving_server.py"
SERVABLES = "/var/lib/msgpu/servables"
WORK_DIR = "/var/lib/msgpu/serving"
# Sandbox containers share the machine's network: the launcher test listens on ports of its own, away
# from the role's default 5500 that other tests' servers may hold.
TEST_GRPC = "127.0.0.1:15500"
TEST_REST = "127.0.0.1:15501"
# Paths Ansible, apt's lists and the kernel touch on any run; a change anywhere else is the role's.
# What the refusals must leave unchanged (testbed/fingerprint.py: state, not only mtimes); the apt lists and
# cache are metadata a refused run may refresh.
FINGERPRINT = fingerprint.script(
    marker="/serving-marker",
    prune=(*fingerprint.PRUNE, "/var/lib/apt/lists", "/var/cache/apt"),
    prune_names=(*fingerprint.PRUNE_NAMES, ".ansible"),
)


def in_env(host: ServingHost, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `script` as the virtualenv's owner in a shell that sourced the stack's env file."""
    env_file = f"/etc/msgpu/env/mindspore-{host.stack_name}.sh"
    return host.sh(f". {env_file} 2>/dev/null && cd {WORK_DIR} && {script}", user=USER, timeout=timeout)


def fingerprint(host: ServingHost) -> str:
    result = host.sh(FINGERPRINT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_site_yml_installs_serving(serving_host: ServingHost):
    run = serving_host.first_run
    recap = run.recap()
    assert run.rc == 0, run.output[-6000:]
    assert recap[serving_host.name]["failed"] == 0 and recap[serving_host.name]["changed"] > 0, recap


def test_serving_imports_in_the_venv_at_the_catalog_release(serving_host: ServingHost):
    result = in_env(
        serving_host,
        "python -c 'import importlib.metadata as m, mindspore_serving.server, mindspore_serving.client; "
        f'print(m.version("{PACKAGE}"))\'',
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == VERSION


def test_the_catalog_pins_hold_in_the_venv(serving_host: ServingHost):
    pins = [Requirement(pin) for pin in SERVING["pins"]]
    assert pins, "the catalog names no pin for this Serving release"
    names = json.dumps([pin.name for pin in pins])
    script = f"import importlib.metadata as m, json; print(json.dumps({{n: m.version(n) for n in {names}}}))"
    result = serving_host.sh(f"{VENV}/bin/python -c {shlex.quote(script)}", user=USER)
    assert result.returncode == 0, result.stderr
    installed = json.loads(result.stdout)
    for pin in pins:
        assert pin.specifier.contains(Version(installed[pin.name]), prereleases=True), (str(pin), installed)


def test_the_venv_marker_records_the_release(serving_host: ServingHost):
    marker = serving_host.sh(f"cat {VENV}/.msgpu-serving").stdout
    assert f"package={PACKAGE} version={VERSION}" in marker, marker
    wheel_sha = SERVING["wheels"]["cp38"]["sha256"]
    assert f"wheel-sha256={wheel_sha}" in marker, marker


def test_the_unit_runs_the_launcher_as_the_owner_in_the_env_file(serving_host: ServingHost):
    unit = serving_host.sh(f"cat {UNIT}").stdout
    env_file = f"/etc/msgpu/env/mindspore-{serving_host.stack_name}.sh"
    lines = unit.splitlines()
    assert f"User={USER}" in lines, unit
    assert f"WorkingDirectory={WORK_DIR}" in lines, unit
    assert "Restart=on-failure" in lines and "RestartPreventExitStatus=2 3 4" in lines, unit
    assert "WantedBy=multi-user.target" in lines and "NoNewPrivileges=true" in lines, unit
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert exec_start.startswith('ExecStart=/bin/bash -c \'. "$$0" && exec python "$$@"\' '), exec_start
    assert f" {env_file} {LAUNCHER} --servables-dir {SERVABLES} --grpc-address 127.0.0.1:5500 " in exec_start
    assert "--device-ids 0" in exec_start and f"--work-dir {WORK_DIR}" in exec_start, exec_start
    keys = {line.split("=", 1)[0] for line in lines if "=" in line and not line.startswith("#")}
    assert not keys & {"PrivateDevices", "ProtectHome", "MemoryDenyWriteExecute"}, "would break the GPU or the venv"
    mode = serving_host.sh(f"stat -c '%U:%G %a' {UNIT}").stdout.split()
    assert mode == ["root:root", "644"], mode


def test_the_run_says_the_unit_is_not_loaded_without_systemd(serving_host: ServingHost):
    output = " ".join(serving_host.first_run.output.split())
    assert ", not systemd (a container, say)" in output, output[-3000:]
    assert f"{UNIT} is written but not loaded, enabled or started" in output, output[-3000:]


@pytest.mark.parametrize(
    ("path", "owner_mode"),
    [
        pytest.param(SERVABLES, f"{USER}:{USER} 755", id="servables"),
        pytest.param(WORK_DIR, f"{USER}:{USER} 750", id="work-dir"),
        pytest.param(LAUNCHER, "root:root 755", id="launcher"),
    ],
)
def test_owners_and_modes(serving_host: ServingHost, path: str, owner_mode: str):
    assert serving_host.sh(f"stat -c '%U:%G %a' {path}").stdout.strip() == owner_mode


def test_the_launcher_refuses_a_missing_servable(serving_host: ServingHost):
    result = in_env(
        serving_host, f"python {LAUNCHER} --servables-dir {SERVABLES} --servable nope --grpc-address 127.0.0.1:5500"
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert f"servable 'nope': {SERVABLES}/nope does not exist" in result.stderr and "serving_servables" in result.stderr


# A servable whose only stage is Python code: Serving runs it without a device.
ECHO_SERVABLE = """
from mindspore_serving.server import register


def double(x):
    return x * 2


@register.register_method(output_names=["y"])
def predict(x):
    y = register.add_stage(double, x, outputs_count=1)
    return y
"""
CLIENT = """
import sys

import numpy as np
from mindspore_serving.client import Client

result = Client(sys.argv[1], "echo", "predict").infer([{"x": np.array([1.5, -2.0], np.float32)}])
print(result[0]["y"].tolist())
"""

# The RESTful API with the host's own python3 (standard library only).
REST_CLIENT = """
import json
import sys
import urllib.request

body = json.dumps({"instances": [{"x": [2.0]}]}).encode()
request = urllib.request.Request(f"http://{sys.argv[1]}/model/echo:predict", data=body, method="POST")
print(urllib.request.urlopen(request, timeout=30).read().decode())
"""


def test_the_launcher_serves_over_grpc_and_rest_and_stops_on_sigterm(serving_host: ServingHost):
    setup = serving_host.sh(
        f"mkdir -p {SERVABLES}/echo/1 && cat > {SERVABLES}/echo/servable_config.py <<'EOF'\n{ECHO_SERVABLE}\nEOF",
        user=USER,
    )
    assert setup.returncode == 0, setup.stderr
    started = time.monotonic()
    # A wrapper in its own session (it outlives this `docker exec`) records the launcher's pid and,
    # once it ended, its exit status.
    command = (
        f"python {LAUNCHER} --servables-dir {SERVABLES} --servable echo --grpc-address {TEST_GRPC} "
        f"--restful-address {TEST_REST} --work-dir {WORK_DIR}"
    )
    wrapper = f"{command} & echo $! > /tmp/launcher.pid; wait $!; echo $? > /tmp/launcher.rc"
    launch = in_env(
        serving_host,
        f"rm -f /tmp/launcher.*; setsid nohup sh -c {shlex.quote(wrapper)} > /tmp/launcher.log 2>&1 < /dev/null & "
        "for i in $(seq 120); do grep -q 'msgpu-serving: serving' /tmp/launcher.log && exit 0; "
        "test -e /tmp/launcher.rc && exit 1; sleep 0.5; done; exit 1",
    )
    log = serving_host.sh("cat /tmp/launcher.log").stdout
    assert launch.returncode == 0, log[-3000:]
    up = time.monotonic() - started
    try:
        grpc = in_env(serving_host, f"python -c {shlex.quote(CLIENT)} {TEST_GRPC}", timeout=60)
        assert grpc.returncode == 0, grpc.stderr[-2000:]
        assert grpc.stdout.strip().splitlines()[-1] == "[3.0, -4.0]", grpc.stdout
        rest = serving_host.sh(f"python3 -c {shlex.quote(REST_CLIENT)} {TEST_REST}")
        assert json.loads(rest.stdout) == {"instances": [{"y": [4.0]}]}, rest.stdout + rest.stderr
    finally:
        # SIGTERM to the launcher's own process, then wait for the status the wrapper records.
        stop = serving_host.sh(
            "kill -TERM $(cat /tmp/launcher.pid); "
            "for i in $(seq 60); do test -e /tmp/launcher.rc && break; sleep 0.5; done; cat /tmp/launcher.rc",
            user=USER,
        )
    log = serving_host.sh("cat /tmp/launcher.log").stdout
    print(f"launcher: up in {up:.1f} s; {log.count('msgpu-serving')} launcher lines")
    assert stop.stdout.strip() == "0", (stop.stdout, stop.stderr, log[-3000:])
    assert "received SIGTERM, stopping the servables and the servers" in log, log[-3000:]
    # Serving's workers leave once the master is gone (they poll it); "[s]" keeps pgrep off this shell.
    workers = serving_host.sh(
        "for i in $(seq 30); do pgrep -f 'mindspore_serving/server/[s]tart_worker.py' > /dev/null || break; "
        "sleep 0.5; done; pgrep -f 'mindspore_serving/server/[s]tart_worker.py' || true"
    ).stdout.split()
    assert workers == [], f"worker processes left behind: {workers}"
    assert serving_host.sh(f"test -d {WORK_DIR}/serving_logs").returncode == 0


EXPORT = """
import numpy as np
import mindspore as ms
from mindspore import nn, ops


class Add(nn.Cell):
    def construct(self, x, y):
        return ops.add(x, y)


x = ms.Tensor(np.ones([2, 2], np.float32))
ms.export(Add(), x, x, file_name="{dir}/add/1/tensor_add", file_format="MINDIR")
"""
ADD_SERVABLE = """
from mindspore_serving.server import register

model = register.declare_model(model_file="tensor_add.mindir", model_format="MindIR", with_batch_dim=False)


@register.register_method(output_names=["y"])
def add_common(x1, x2):
    y = register.add_stage(model, x1, x2, outputs_count=1)
    return y
"""


def test_the_launcher_names_an_unsupported_device_for_a_mindir_model(serving_host: ServingHost):
    # MindSpore compiles a Cell from its source file: the script must be a file, not `python -c`.
    export = in_env(
        serving_host,
        f"mkdir -p {SERVABLES}/add/1 && cat > /tmp/export_add.py <<'EOF'\n{EXPORT.format(dir=SERVABLES)}\nEOF\n"
        f"python /tmp/export_add.py && test -s {SERVABLES}/add/1/tensor_add.mindir && "
        f"cat > {SERVABLES}/add/servable_config.py <<'EOF'\n{ADD_SERVABLE}\nEOF",
    )
    assert export.returncode == 0, export.stderr[-3000:]
    result = in_env(
        serving_host,
        f"timeout 240 python {LAUNCHER} --servables-dir {SERVABLES} --servable add --grpc-address 127.0.0.1:5500 "
        f"--work-dir {WORK_DIR}",
        timeout=300,
    )
    assert result.returncode == 4, (result.returncode, result.stderr[-3000:])
    assert "msgpu-serving: the device is not supported here" in result.stderr, result.stderr[-3000:]


def test_a_second_run_changes_nothing(serving_host: ServingHost):
    run = serving_host.playbook("--tags", PROVISION_TAGS)
    serving_host.timings["second run"] = run.seconds
    print(f"second site.yml run: {run.seconds:.1f} s")
    assert run.rc == 0, run.output[-4000:]
    assert run.recap()[serving_host.name]["changed"] == 0, run.output[-6000:]


def test_check_mode_changes_nothing(serving_host: ServingHost):
    run = serving_host.playbook("--tags", PROVISION_TAGS, "--check", "--diff")
    serving_host.timings["check run"] = run.seconds
    assert run.rc == 0, run.output[-4000:]
    assert run.recap()[serving_host.name]["changed"] == 0, run.output[-6000:]


REFUSALS = [
    pytest.param(
        {"serving_grpc_address": "127.0.0.1:99999"},
        ['serving_grpc_address: "127.0.0.1:99999" is malformed', "HOST:PORT (port 1-65535"],
        id="grpc-port",
    ),
    pytest.param(
        {"serving_grpc_address": "localhost"}, ['serving_grpc_address: "localhost" is malformed'], id="grpc-no-port"
    ),
    pytest.param(
        {"serving_restful_address": "127.0.0.1:5500"},
        ["serving_restful_address: the same address as serving_grpc_address"],
        id="restful-same",
    ),
    pytest.param(
        {"serving_servables": ["../etc"]}, ['serving_servables: ["../etc"] are not folder names'], id="servable-name"
    ),
    pytest.param({"serving_device_type": "TPU"}, ["serving_device_type", "GPU"], id="device-type"),
    pytest.param(
        {"stack_name": STACKS_WITHOUT_SERVING[0]},
        ["stack_serving_enabled", "has no MindSpore Serving release", "allowed: false, or a stack_name with Serving"],
        id="stack-without-serving",
    ),
]


@pytest.mark.parametrize(("extra_vars", "expected"), REFUSALS)
def test_bad_input_is_refused_before_any_change(serving_host: ServingHost, extra_vars: dict, expected: list[str]):
    assert serving_host.sh("touch /serving-marker").returncode == 0
    before = fingerprint(serving_host)
    run = serving_host.playbook("--tags", "preflight,serving", extra_vars=extra_vars)
    assert run.rc != 0, run.output[-4000:]
    for text in expected:
        assert text in run.output, (text, run.output[-4000:])
    assert fingerprint(serving_host) == before, "the refused run changed the host"


def recap_changed(run: PlaybookRun, host: ServingHost) -> int:
    assert run.rc == 0, run.output[-4000:]
    return run.recap()[host.name]["changed"]


@pytest.mark.removes_serving
def test_serving_state_absent_removes_it_and_a_second_run_changes_nothing(serving_host: ServingHost):
    first = serving_host.playbook("--tags", "preflight,serving", extra_vars={"serving_state": "absent"})
    serving_host.timings["absent"] = first.seconds
    assert recap_changed(first, serving_host) > 0, first.output[-4000:]
    gone = serving_host.sh(
        f"{VENV}/bin/python -c 'import importlib.metadata as m; m.version(\"{PACKAGE}\")'", user=USER
    )
    assert gone.returncode != 0 and "PackageNotFoundError" in gone.stderr, gone.stdout + gone.stderr
    for path in (UNIT, LAUNCHER, WORK_DIR, f"{VENV}/.msgpu-serving"):
        assert serving_host.sh(f"test -e {path}").returncode != 0, f"{path} is still there"
    cached = serving_host.sh("ls /var/cache/msgpu/artifacts").stdout.split()
    assert not [name for name in cached if name.startswith("mindspore_serving-")], cached
    # The user's models stay, and so does MindSpore.
    assert serving_host.sh(f"test -f {SERVABLES}/echo/servable_config.py").returncode == 0
    assert serving_host.sh(f"test -x {VENV}/bin/python && test -f {VENV}/.msgpu-installed").returncode == 0

    second = serving_host.playbook("--tags", "preflight,serving", extra_vars={"serving_state": "absent"})
    serving_host.timings["absent again"] = second.seconds
    print(f"serving_state=absent: {first.seconds:.1f} s, again {second.seconds:.1f} s")
    assert recap_changed(second, serving_host) == 0, second.output[-4000:]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze on this controller")
def test_systemd_accepts_the_unit(serving_host: ServingHost, tmp_path):
    """systemd's own parser: every key known, the command line well formed (a typo only warns)."""
    unit = tmp_path / "msgpu-serving.service"
    unit.write_text(serving_host.sh(f"cat {UNIT}").stdout)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and str(unit) not in result.stderr, result.stderr
