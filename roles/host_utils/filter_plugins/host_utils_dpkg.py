"""What dpkg says is installed: the `host_utils_dpkg_installed` filter, for every role that reads dpkg's state
before it calls apt (a re-run that finds every package installed skips apt and its async poll; a branch or
module-source change finds the packages to remove).

The roles read dpkg with `dpkg-query --show --showformat='${db:Status-Status} ${Package}\\n' [package...]`
(or `${Package}=${Version}` to compare versions too): a line ``<status> <package>`` per package dpkg
knows; a package it does not know gives no line (and rc 1). Standard library only, like stack_catalog.py.
"""

from __future__ import annotations

from typing import Any


def dpkg_installed(result: Any) -> list[str]:
    """The packages (``name`` or ``name=version``, as the format printed them) whose status is `installed`,
    from a registered dpkg-query result or its stdout lines. A skipped task (no stdout) gives []."""
    lines = result.get("stdout_lines", []) if isinstance(result, dict) else result
    installed = []
    for line in lines or []:
        fields = str(line).split()
        if len(fields) == 2 and fields[0] == "installed":
            installed.append(fields[1])
    return installed


class FilterModule:
    """Ansible filter plugin entry point."""

    def filters(self) -> dict[str, Any]:
        return {"host_utils_dpkg_installed": dpkg_installed}
