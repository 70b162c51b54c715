"""The controller's artifact cache, from the hosts' resolved stacks (stack_resolved, published by the stack role's
preflight): which pinned files and which MindSpore wheelhouses a run needs (tasks/cache.yml)."""

from __future__ import annotations

from typing import Any


def cache_manifest(stacks: list[dict[str, Any]], python_tags: list[str], components: list[str]) -> list[dict[str, Any]]:
    """The files the controller's cache must hold for these hosts: each host's resolved stack,
    its Python tag (the MindSpore wheel is per interpreter), only the components this run installs,
    each file once (by its place in the cache)."""
    manifest: dict[str, dict[str, Any]] = {}
    for stack, tag in zip(stacks, python_tags):
        for entry in stack.get("artifact_cache", {}).get("downloads", []):
            if entry["component"] in components and entry["python_tag"] in ("", tag):
                manifest.setdefault(entry["dest"], entry)
    return [manifest[dest] for dest in sorted(manifest)]


def cache_wheelhouses(stacks: list[dict[str, Any]], python_tags: list[str], components: list[str]) -> list[dict]:
    """One wheelhouse of MindSpore's dependencies per (stack, Python tag) of the hosts, when the
    cache is on and the run installs MindSpore (or Serving, whose dependencies it also holds)."""
    houses: dict[str, dict[str, Any]] = {}
    if "mindspore" not in components and "serving" not in components:
        return []
    for stack, tag in zip(stacks, python_tags):
        base = stack.get("artifact_cache", {}).get("wheelhouse", "")
        ms = stack.get("mindspore", {})
        if base and tag in ms.get("wheels", {}):
            requirements = [f"{ms['package']}=={ms['version']}", *ms.get("pins", [])]
            exclude = [ms["wheels"][tag]["file"]]
            serving = stack.get("serving", {})
            if serving.get("enabled") and tag in serving.get("wheels", {}):
                wheel = serving["wheels"][tag]
                # A PyPI release brings its own dependencies; the vendor's wheel is not on the index,
                # so the catalog lists its dependencies instead.
                if wheel.get("source") == "pypi":
                    requirements.append(f"{serving['package']}=={serving['version']}")
                requirements += [*serving.get("dependencies", []), *serving.get("pins", [])]
                exclude.append(wheel["file"])
            houses.setdefault(
                f"{base}-{tag}",
                {
                    "dir": f"{base}-{tag}",
                    "python_tag": tag,
                    "requirements": requirements,
                    "exclude": exclude,
                    "index_url": stack.get("sources", {}).get("pypi", ""),
                },
            )
    return [houses[key] for key in sorted(houses)]


def cache_components(
    states: dict[str, str], run_tags: list[str], skip_tags: list[str], chosen: list[str] | None = None
) -> list[str]:
    """The components whose files a run needs: `chosen` (a standalone playbook's own), or those a
    site.yml run selects with --tags/--skip-tags; either way only those whose state is present."""
    if chosen is None:
        chosen = [c for c in states if "all" in run_tags or c in run_tags or f"role::{c}" in run_tags]
        chosen = [c for c in chosen if c not in skip_tags and f"role::{c}" not in skip_tags]
    return [c for c in chosen if states.get(c, "present") == "present"]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "artifacts_cache_manifest": cache_manifest,
            "artifacts_cache_components": cache_components,
            "artifacts_cache_wheelhouses": cache_wheelhouses,
        }
