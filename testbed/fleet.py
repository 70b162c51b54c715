"""A fleet of sandbox hosts: Ubuntu 20.04 containers on their own Docker bridge network.

Unlike the single sandbox host (which shares the machine's network namespace so that it can reach
the loopback fixture mirror), fleet hosts have addresses of their own and talk to each other over
TCP, as servers in a rack do (MPI, SSH). They reach the package registries through NAT, not the
controller's loopback: NVIDIA's artifacts come to them from the controller's artifact cache.
"""

from __future__ import annotations

from testbed import sandbox

NETWORK = "msgpu-fleet"


def ensure_network(name: str = NETWORK) -> str:
    """Create the bridge network once (it outlives the containers)."""
    sandbox.ensure_docker()
    if sandbox.run(["docker", "network", "inspect", name], check=False, capture=True).returncode != 0:
        sandbox.run(["docker", "network", "create", "--label", sandbox.LABEL, name], capture=True)
    return name


def start(names: list[str], network: str = NETWORK, flavour: str = "focal") -> list[str]:
    """(Re)create one fresh container per name on `network`."""
    ensure_network(network)
    return [sandbox.start_host(name, flavour, network=network) for name in names]


def stop(names: list[str]) -> None:
    for name in names:
        sandbox.stop_host(name)


def address(name: str, network: str = NETWORK) -> str:
    """The container's IPv4 address on the fleet network."""
    result = sandbox.run(
        ["docker", "inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}', name],
        capture=True,
    )
    return result.stdout.strip()
