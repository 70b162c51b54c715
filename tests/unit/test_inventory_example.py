"""The admin's first files: inventory/example lists every catalog stack, claims no login the catalog does not
need, has a host_vars example that the resolver accepts, and a run at its placeholder hosts is refused before
any host is contacted (roles/stack/tasks/inventory.yml, through ansible-playbook on the controller)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, controller_playbook

EXAMPLE = ROOT / "inventory" / "example"
CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())


def test_the_examples_stack_list_is_the_catalogs():
    text = (EXAMPLE / "group_vars" / "gpu_servers" / "stack.yml").read_text()
    listed = text.split("# One of:", 1)[1].split("stack_name:", 1)[0]
    named = re.findall(r"\bms[0-9.]+-cuda[0-9.]+\b", listed)
    assert named == list(CATALOG["stacks"]), "inventory/example/group_vars/gpu_servers/stack.yml lists other stacks"


def test_the_example_claims_a_login_only_for_what_the_catalog_has_behind_one():
    text = (EXAMPLE / "group_vars" / "gpu_servers" / "stack.yml").read_text()
    assert "tarballs need a login" not in text
    default = CATALOG["stacks"][CATALOG["default_stack"]]
    for component in ("cudnn", "nccl"):
        method = default["default_methods"][component]
        artifact = CATALOG[component][default[component]][method]
        assert "secure" not in artifact.get("path", ""), (component, artifact)  # NVIDIA's login-walled folder
    trt = CATALOG["tensorrt"][default["tensorrt"]]["tarball"]
    assert "/secure/" in trt["path"] and "TensorRT 7.2.2.3 tarball" in text


def test_every_host_vars_example_resolves(stack_catalog):
    files = sorted((EXAMPLE / "host_vars").glob("*.yml"))
    assert files, "inventory/example/host_vars has no example"
    hosts = yaml.safe_load((EXAMPLE / "hosts.yml").read_text())["all"]["children"]["gpu_servers"]["hosts"]
    group = yaml.safe_load((EXAMPLE / "group_vars" / "gpu_servers" / "stack.yml").read_text())
    for path in files:
        assert path.stem in hosts, f"{path.name} names no host of inventory/example/hosts.yml"
        settings = {**group, **yaml.safe_load(path.read_text())}
        stack = {k.removeprefix("stack_"): v for k, v in settings.items() if k.startswith("stack_")}
        result = stack_catalog.resolve_stack(CATALOG, stack)
        # The vendor's MindSpore 2.2.14 wheel has no public checksum: the one error a site answers with its own.
        assert all("no public sha256" in e for e in result["errors"]), (path.name, result["errors"])
        assert result["stack"]["name"] == settings["stack_name"]


def preflight(tmp_path: Path, hosts: dict):
    return controller_playbook(tmp_path, "playbooks/preflight.yml", hosts)


@pytest.mark.parametrize(
    ("hosts", "named"),
    [
        (None, "gpu01.example.org (192.0.2.11), gpu02.example.org (192.0.2.12)"),
        ({"lab.test": {}, "real": {"ansible_host": "198.51.100.7"}}, "lab.test, real (198.51.100.7)"),
    ],
    ids=["the-example", "other-reserved"],
)
def test_placeholder_hosts_are_refused_before_any_host_is_contacted(tmp_path, hosts, named):
    hosts = hosts or yaml.safe_load((EXAMPLE / "hosts.yml").read_text())["all"]["children"]["gpu_servers"]["hosts"]
    result = preflight(tmp_path, hosts)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert f"inventory: {named} in group 'gpu_servers' are placeholders like those of inventory/example" in output
    assert "cp -r inventory/example inventory/mysite" in output
    # Only the controller's inventory check ran: no play reached a host.
    assert "PLAY [Validate the configuration against the stack catalog]" not in result.stdout


def test_real_names_and_addresses_are_not_placeholders():
    stack_tasks = yaml.safe_load((ROOT / "roles" / "stack" / "tasks" / "inventory.yml").read_text())
    pattern = next(t for t in stack_tasks if "placeholder" in t["name"])["vars"]["__stack_placeholder_re"].strip()
    for name in (
        "gpu01",
        "gpu01.lab.example.edu.cn",
        "10.0.0.5",
        "192.0.20.1",
        "mygpu.org",
        "notexample.org",
        "h.test.lab",
    ):
        assert not re.match(pattern, name), name
    for name in (
        "gpu01.example.org",
        "example.com",
        "a.b.example",
        "x.test",
        "y.invalid",
        "192.0.2.1",
        "203.0.113.254",
    ):
        assert re.match(pattern, name), name
