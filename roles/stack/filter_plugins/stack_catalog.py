"""Resolve a stack from the catalog (catalog/stacks.yml) and check a configuration against it.

Used by the `stack` role (preflight) as the `stack_resolve` filter, and imported directly by the
unit tests and the controller-side tools. Standard library only: it must load in any Ansible
controller environment.

`resolve_stack(catalog, settings)` never raises for bad user input: it returns
``{"errors": [...], "warnings": [...], "stack": {...}}`` where every error names the variable
that caused it and what is allowed instead.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

DISPLAY = {
    "mindspore": "MindSpore",
    "driver": "NVIDIA driver branch",
    "cuda": "CUDA",
    "cudnn": "cuDNN",
    "nccl": "NCCL",
    "tensorrt": "TensorRT",
    "serving": "MindSpore Serving",
}
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
URL_RE = re.compile(r"^(https?|file)://\S+$")


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key for dotted versions ('450.80.02' -> (450, 80, 2))."""
    return tuple(int(part) for part in re.findall(r"\d+", str(version)))


def accepted_versions(catalog: dict[str, Any], component: str, stack_name: str = "", method: str = "") -> list[str]:
    """The versions of `component` a stack accepts: its own, then its `also_accepts`, in that order.

    `stack_name`: the catalog's default stack when empty. `method`: only versions with that artifact
    (e.g. 'wheel') in the catalog."""
    stack = catalog["stacks"][stack_name or catalog["default_stack"]]
    versions = [str(stack[component]), *[str(v) for v in stack.get("also_accepts", {}).get(component, [])]]
    return [v for v in versions if not method or method in catalog[component].get(v, {})]


def cuda_versions_for_driver(catalog: dict[str, Any], driver_version: str) -> list[str]:
    """The catalog's CUDA versions whose minimum driver `driver_version` meets, oldest first."""
    driver = version_key(driver_version)
    fits = [v for v, entry in catalog["cuda"].items() if version_key(entry["minimum_driver"]) <= driver]
    return sorted(fits, key=version_key)


def _allowed(values: Any) -> str:
    items = ["'' (the default)" if str(v) == "" else str(v) for v in values]
    return ", ".join(items) if items else "(none)"


def _whole(value: Any) -> Any:
    """A whole-number setting as a number ("3" from a template is 3); anything else as it is."""
    return int(value) if str(value).strip().isdigit() else value


def _is_number(value: Any) -> bool:
    """YAML's unquoted 11.10 is the float 11.1, 470 the int 470: versions must be strings."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unquoted(variable: str, values: list[Any], fix: str) -> str:
    """The refusal of version numbers written without quotes, with the line to write instead."""
    numbers = [str(v) for v in values if _is_number(v)]
    floats = [str(v) for v in values if isinstance(v, float)]
    what = f"{numbers[0]} is a number" if len(numbers) == 1 else f"{', '.join(numbers)} are numbers"
    why = f" (YAML reads {floats[0]}0 as {floats[0]})" if floats else ""
    return f"{what}{why}; allowed: a version in quotes; write {variable}: {fix}"


class _Resolver:
    def __init__(self, catalog: dict[str, Any], settings: dict[str, Any]) -> None:
        self.catalog = catalog
        self.settings = settings
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def setting(self, name: str, default: Any = "") -> Any:
        value = self.settings.get(name, default)
        return default if value is None else value

    def error(self, variable: str, message: str) -> None:
        self.errors.append(f"{variable}: {message}")

    def text(self, name: str, default: str = "") -> str:
        """A version setting (stack_<name>) as text, `default` when empty; a number is refused."""
        value = self.setting(name, "")
        if _is_number(value):
            fix = f'"{value}" (or "{value}0", whichever you meant)' if isinstance(value, float) else f'"{value}"'
            self.error(f"stack_{name}", _unquoted(f"stack_{name}", [value], fix))
        return str(value if _is_number(value) else value or default)

    # --- sources and artifacts -------------------------------------------------------------
    def sources(self) -> dict[str, str]:
        merged = dict(self.catalog.get("sources", {}))
        overrides = self.setting("sources", {})
        if not isinstance(overrides, dict):
            self.error("stack_sources", f"must be a mapping of source name to URL, got {type(overrides).__name__}")
            return merged
        for name, url in overrides.items():
            if name not in merged:
                self.error("stack_sources", f"unknown source '{name}'; allowed: {_allowed(sorted(merged))}")
            elif not isinstance(url, str) or not URL_RE.match(url):
                self.error(f"stack_sources.{name}", f"'{url}' is not a URL; allowed: http://, https:// or file:// URLs")
            else:
                merged[name] = url.rstrip("/")
        return merged

    def checksums(self) -> dict[str, str]:
        overrides = self.setting("artifact_checksums", {})
        if not isinstance(overrides, dict):
            self.error("stack_artifact_checksums", "must be a mapping of file name to sha256")
            return {}
        good: dict[str, str] = {}
        for name, value in overrides.items():
            value = str(value).lower().removeprefix("sha256:")
            if not SHA256_RE.match(value):
                self.error(
                    f"stack_artifact_checksums.{name}",
                    f"'{overrides[name]}' is not a sha256 checksum; allowed: 64 hexadecimal characters",
                )
            else:
                good[name] = value
        return good

    def local_artifacts(self) -> dict[str, str]:
        paths = self.setting("local_artifacts", {})
        if not isinstance(paths, dict):
            self.error("stack_local_artifacts", "must be a mapping of file name to a path on the controller")
            return {}
        found: dict[str, str] = {}
        for name, path in paths.items():
            if not os.path.isfile(str(path)):
                self.error(f"stack_local_artifacts.{name}", f"'{path}' does not exist on the controller")
            else:
                found[str(name)] = str(path)
        return found

    def artifact(
        self, entry: dict[str, Any], sources: dict[str, str], checksums: dict[str, str], local: dict[str, str]
    ) -> dict[str, Any]:
        """Complete a catalog artifact entry with its URL, checksum override and local path."""
        art = dict(entry)
        name = art.get("file", "")
        if art.get("source") == "pypi":
            art["index_url"] = sources.get("pypi", "")
            if art.get("package") and art.get("version"):
                art["requirement"] = f"{art['package']}=={art['version']}"
        elif art.get("source") in sources:
            art["url"] = f"{sources[art['source']]}/{art['path']}"
        if name in checksums:
            art["sha256"] = checksums[name]
        if name in local:
            art["local_path"] = local[name]
            if art.get("sha256"):
                # A pinned file given as the user's copy: the preflight hashes the copy against the pin before
                # any host changes (the artifacts role's tasks/check_local.yml: artifact_cache.py --check-local).
                art["local_pin"] = (
                    f"stack_artifact_checksums.{name}"
                    if name in checksums
                    else f"the catalog's sha256 ({str(entry.get('sha256_from') or 'catalog/stacks.yml').strip()})"
                )
            else:
                # The user's own copy without a pinned sum: the hosts' copies must match the controller's.
                art["sha256"] = file_sha256(local[name])
        return art

    # --- component choices -----------------------------------------------------------------
    def method(self, component: str, entry: dict[str, Any], version: str, stack: dict[str, Any]) -> str:
        variable = f"stack_{component}_method"
        default = stack.get("default_methods", {}).get(component, "")
        chosen = str(self.setting(f"{component}_method", "") or default)
        known = self.catalog["install_methods"][component]
        if chosen not in known:
            self.error(
                variable,
                f"'{chosen}' is not an install method for {component}; allowed: {_allowed(known)}, "
                f"or '' (the stack's default, {default})",
            )
            return chosen
        available = [m for m in known if m in entry]
        unavailable = entry.get("unavailable", {}) or {}
        if chosen not in entry and chosen in unavailable:
            self.error(
                variable,
                f"'{chosen}' is not offered for {DISPLAY[component]} {version}: "
                f"{' '.join(str(unavailable[chosen]).split())}; allowed for it: {_allowed(available)}",
            )
        elif chosen not in entry:
            alternatives = [v for v, e in self.catalog[component].items() if chosen in e and v != version]
            hint = f" (or a {DISPLAY[component]} version that has it: {_allowed(alternatives)})" if alternatives else ""
            self.error(
                variable,
                f"{DISPLAY[component]} {version} has no '{chosen}' artifact; "
                f"allowed for it: {_allowed(available)}{hint}",
            )
        return chosen

    def version(self, component: str, stack: dict[str, Any]) -> str:
        """The stack's version of a component, or the user's override when the stack accepts it."""
        variable = f"stack_{component}_version"
        default = str(stack[component])
        chosen = self.text(f"{component}_version", default)
        accepted = accepted_versions(self.catalog, component, stack["name"])
        if chosen not in self.catalog[component]:
            self.error(variable, f"'{chosen}' is not in the catalog; allowed: {_allowed(self.catalog[component])}")
        elif chosen not in accepted:
            self.error(
                variable,
                f"{DISPLAY[component]} {chosen} is not supported with stack '{stack['name']}'; "
                f"allowed: {_allowed(accepted)}",
            )
        return chosen

    def resolve(self) -> dict[str, Any]:
        stacks = self.catalog["stacks"]
        name = str(self.setting("name", "") or self.catalog["default_stack"])
        if name not in stacks:
            self.error("stack_name", f"'{name}' is not in the catalog; allowed: {_allowed(stacks)}, or 'auto'")
            return {}
        stack = dict(stacks[name], name=name)
        sources = self.sources()
        checksums = self.checksums()
        local = self.local_artifacts()

        def art(entry: dict[str, Any]) -> dict[str, Any]:
            return self.artifact(entry, sources, checksums, local)

        resolved: dict[str, Any] = {"name": name, "description": stack.get("description", "").strip()}

        # MindSpore decides which CUDA and cuDNN major it was built for.
        ms_version = self.version("mindspore", stack)
        ms = self.catalog["mindspore"].get(ms_version, {})
        resolved["mindspore"] = {
            "version": ms_version,
            "package": ms.get("package", ""),
            "pins": list(ms.get("pins", [])),
            "libraries_required": list(ms.get("libraries_required", [])),
            "libraries_optional": list(ms.get("libraries_optional", [])),
            "wheels": {
                tag: art(dict(w, package=ms.get("package"), version=ms_version))
                for tag, w in ms.get("wheels", {}).items()
            },
        }
        resolved["python_tags"] = sorted(ms.get("wheels", {}))

        cuda_version = self.version("cuda", stack)
        cuda = self.catalog["cuda"].get(cuda_version, {})
        if ms and cuda_version not in ms.get("cuda", []):
            self.error(
                "stack_cuda_version",
                f"CUDA {cuda_version} does not match {ms.get('package')} {ms_version}, which is built for "
                f"CUDA {_allowed(ms.get('cuda', []))}; allowed: {_allowed(ms.get('cuda', []))}",
            )
        extra = self.setting("cuda_extra_versions", [])
        if not isinstance(extra, list):
            self.error(
                "stack_cuda_extra_versions",
                f"must be a list, got {extra}; allowed: CUDA versions in quotes; "
                f'write stack_cuda_extra_versions: ["{extra}"]',
            )
            extra = []
        listed = [str(v) for v in extra]
        once = list(dict.fromkeys(listed))
        fix = "[" + ", ".join(f'"{v}"' for v in once) + "]"
        if any(_is_number(v) for v in extra):
            self.error("stack_cuda_extra_versions", _unquoted("stack_cuda_extra_versions", extra, fix))
        for ver in once:
            if ver not in self.catalog["cuda"]:
                self.error(
                    "stack_cuda_extra_versions",
                    f"'{ver}' is not in the catalog; allowed: {_allowed(self.catalog['cuda'])}",
                )
        repeated = [f'"{v}"' for v in once if listed.count(v) > 1]
        if repeated:
            self.error(
                "stack_cuda_extra_versions",
                f"{', '.join(repeated)} {'is' if len(repeated) == 1 else 'are'} listed more than once; "
                f"allowed: each version once; write stack_cuda_extra_versions: {fix}",
            )
        if cuda_version in once:
            # Not refused: an inventory-wide list may name the CUDA that one host's stack has anyway.
            self.warnings.append(
                f"stack_cuda_extra_versions: {cuda_version} is the stack's own CUDA (stack_cuda_version), "
                "installed anyway; the entry changes nothing"
            )
        versions = [cuda_version, *[v for v in once if v != cuda_version]]
        cuda_method = self.method("cuda", cuda, cuda_version, stack)
        resolved["cuda"] = {
            "version": cuda_version,
            "full_version": cuda.get("full_version", ""),
            "method": cuda_method,
            "versions": versions,
            # One entry per toolkit to install, the stack's (the default) first.
            "toolkits": [
                {
                    "version": v,
                    "full_version": self.catalog["cuda"][v]["full_version"],
                    "minimum_driver": self.catalog["cuda"][v]["minimum_driver"],
                    "artifact": art(self.catalog["cuda"][v].get(cuda_method, {})),
                }
                for v in versions
                if v in self.catalog["cuda"]
            ],
        }

        self.resolve_cudnn(stack, resolved, cuda_version, ms, art)
        self.resolve_nccl(stack, resolved, cuda_version, art)
        self.resolve_serving(stack, resolved, art)
        self.resolve_tensorrt(stack, resolved, cuda_version, art)
        self.resolve_driver(stack, resolved, versions, art)
        resolved["openmpi"] = {"version": str(stack["openmpi"]), **self.catalog["openmpi"][str(stack["openmpi"])]}
        self.require_checksums(resolved)
        resolved["sources"] = sources
        resolved["platforms"] = self.catalog.get("platforms", {})
        mnist = self.catalog.get("mnist", {})
        resolved["mnist"] = {
            "url": sources.get(mnist.get("source", ""), ""),
            "files": dict(mnist.get("files", {})),
            # For the verify role's fetch: every source's base URL in order (stack_sources applied), the copy in
            # this repository (relative to the project), and the sums a file may have (the mirrors' .gz, or its
            # decompressed content, whoever gzipped it).
            "sources": [sources[name] for name in mnist.get("sources", [mnist.get("source", "")]) if name in sources],
            "repository_copy": mnist.get("repository_copy", ""),
            "sums": {**dict(mnist.get("published", mnist.get("files", {}))), **dict(mnist.get("idx", {}))},
        }
        resolved["cuda_wheels"] = {
            name: art(dict(entry, package=name, source="pypi"))
            for name, entry in self.catalog.get("cuda_wheels", {}).items()
        }
        resolved["verified_on_gpu"] = bool(stack.get("verified_on_gpu", False))
        resolved["gpu_code"] = self.gpu_code(resolved)
        self.apply_cache(resolved)
        resolved["disk"] = self.disk_parts(resolved)
        resolved["disk_mb"] = sum(part["mb"] for part in resolved["disk"])
        return resolved

    def gpu_code(self, resolved: dict[str, Any]) -> list[dict[str, Any]]:
        """What each component the stack installs runs on, for verify/msgpu_verify/compute.py: the vendor's
        word (`gpu:` under the version here) and what the wheel's libraries carry, where measured
        (catalog/gpu_code.yml, loaded beside this catalog as `gpu_code`). TensorRT only when it is installed."""
        measured = self.catalog.get("gpu_code") or {}
        parts = [("mindspore", "MindSpore"), ("cuda", "CUDA"), ("cudnn", "cuDNN"), ("nccl", "NCCL")]
        if resolved.get("tensorrt", {}).get("enabled"):
            parts.append(("tensorrt", "TensorRT"))
        out = []
        for key, label in parts:
            version = str(resolved.get(key, {}).get("version", ""))
            if not version:
                continue
            code = dict((self.catalog.get(key, {}).get(version) or {}).get("gpu") or {})
            record = (measured.get(key) or {}).get(version) or {}
            libraries = {
                name: lib
                for name, lib in (record.get("libraries") or {}).items()
                if for_cuda(name, str(resolved.get("cuda", {}).get("version", "")))
            }
            measured_in = f"{record.get('wheel', '')}: {record.get('measured', '')}".strip(": ")
            # NCCL, the catalog's or the copy a MindSpore wheel bundles, is loaded by multi-GPU and multi-host
            # training only (compute.py: "single" on a host with one GPU).
            bundled = {n: lib for n, lib in libraries.items() if n.rsplit("/", 1)[-1].startswith("libnccl")}
            own = {n: lib for n, lib in libraries.items() if n not in bundled} if key == "mindspore" else libraries
            if own:
                code["libraries"] = own
                code["measured"] = measured_in
            entry = {"name": label, "version": version, "code": code}
            if key == "nccl":
                entry["multi_gpu_only"] = True
            out.append(entry)
            if key == "mindspore" and bundled:
                out.append(
                    {
                        "name": f"NCCL bundled with {label}",
                        "version": version,
                        "code": {"libraries": bundled, "measured": measured_in},
                        "multi_gpu_only": True,
                    }
                )
        return out

    def disk_parts(self, resolved: dict[str, Any]) -> list[dict[str, Any]]:
        """What the stack puts under stack_install_prefix, part by part, and how the host preflight
        tells that a part is already installed (it then needs no more room): a path under the prefix
        (the role's own install marker, written last) or the Debian packages that carry it. Wheels
        go into the MindSpore virtualenv, not under the prefix, and are not counted - except NVIDIA's
        cuDNN/NCCL wheels, which the cuda_library role unpacks under the CUDA prefix like a tarball."""
        cuda = resolved["cuda"]

        def part(name: str, mb: int, marker: str, method_has_marker: bool, artifact: dict[str, Any]) -> dict[str, Any]:
            # Debian packages are found by name: the catalog's "=<version>" pins are dropped.
            packages = [] if method_has_marker else [p.split("=", 1)[0] for p in artifact.get("packages", [])]
            return {"name": name, "mb": mb, "path": marker if method_has_marker else "", "packages": packages}

        parts = [
            part(
                f"CUDA {t['version']}",
                self.catalog["cuda"][t["version"]].get("disk_mb", 0),
                f"cuda-{t['version']}/.msgpu-installed",
                cuda["method"] == "runfile",
                t["artifact"],
            )
            for t in cuda["toolkits"]
        ]
        for component, display in (("cudnn", "cuDNN"), ("nccl", "NCCL"), ("tensorrt", "TensorRT")):
            entry = resolved[component]
            if entry.get("enabled") is False or (component == "tensorrt" and entry.get("method") == "wheel"):
                continue
            marker = (
                f"TensorRT-{entry['version']}/.msgpu-installed"
                if component == "tensorrt"
                else f"cuda-{cuda['version']}/.msgpu-{component}"
            )
            parts.append(
                part(
                    f"{display} {entry['version']}",
                    entry.get("disk_mb", 0),
                    marker,
                    entry["method"] in ("tarball", "wheel"),
                    entry["artifact"],
                )
            )
        return parts

    # --- the controller's artifact cache ---------------------------------------------------
    @staticmethod
    def chosen_artifacts(resolved: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        """(component tag, python tag or "", artifact) for every file the chosen methods need."""
        chosen = [("cuda", "", t["artifact"]) for t in resolved["cuda"]["toolkits"]]
        chosen += [(c, "", resolved[c].get("artifact", {})) for c in ("cudnn", "nccl", "tensorrt")]
        chosen.append(("nvidia_driver", "", resolved["driver"].get("artifact", {})))
        tensorrt_wheels = resolved.get("tensorrt", {}).get("artifact", {}).get("files", {})
        chosen += [("tensorrt", tag, wheel) for tag, wheel in tensorrt_wheels.items()]
        chosen += [("mindspore", tag, wheel) for tag, wheel in resolved["mindspore"]["wheels"].items()]
        if resolved.get("serving", {}).get("enabled"):
            chosen += [("serving", tag, wheel) for tag, wheel in resolved["serving"]["wheels"].items()]
        return [(component, tag, art) for component, tag, art in chosen if art and art.get("file")]

    def apply_cache(self, resolved: dict[str, Any]) -> None:
        """List what the controller fetches once for every host, and point the roles at its copies.

        With stack_artifact_cache_dir set, every pinned file the chosen methods need gets a
        `local_path` in the cache (the roles then copy it from the controller instead of each host
        downloading it) and an entry in `artifact_cache.downloads` (where it comes from: a URL, or a
        package on the pip index). The files themselves are fetched by the artifacts role's cache.yml.
        """
        cache = self.setting("artifact_cache_dir", "")
        offline = self.setting("offline", False)
        if not isinstance(cache, str) or (cache and not os.path.isabs(cache)):
            self.error(
                "stack_artifact_cache_dir",
                f"'{cache}' is not an absolute path; allowed: an absolute folder on the controller, or '' "
                "(each host downloads its own files)",
            )
            cache = ""
        if not isinstance(offline, bool):
            self.error("stack_offline", f"'{offline}' is not a boolean; allowed: true, false")
            offline = False
        if offline and not cache:
            self.error(
                "stack_offline",
                "an offline run installs from the controller's artifact cache, but stack_artifact_cache_dir "
                "is empty; allowed: stack_offline: false, or a cache folder filled by `./toolkit fetch`",
            )
        cache = cache.rstrip("/")
        downloads: list[dict[str, Any]] = []
        for component, tag, art in self.chosen_artifacts(resolved):
            if art.get("local_path") or not art.get("sha256"):
                continue  # the user's own copy, or an unpinned file (require_checksums reported it)
            entry = {
                "component": component,
                "python_tag": tag,
                "file": art["file"],
                "dest": art["file"],
                "sha256": art["sha256"],
                "size": art.get("size", 0),
            }
            if art.get("source") == "pypi":
                entry.update(index_url=art.get("index_url", ""), package=art.get("package", ""))
            else:
                entry["url"] = art.get("url", "")
            downloads.append(entry)
            if cache:
                art["local_path"] = f"{cache}/{art['file']}"
                art["cached"] = True
        mnist_url = resolved["mnist"]["url"]
        for name, sha256 in resolved["mnist"]["files"].items():
            downloads.append(
                {
                    "component": "mnist",
                    "python_tag": "",
                    "file": name,
                    "dest": f"mnist/{name}",
                    "sha256": sha256,
                    "size": 0,
                    "url": f"{mnist_url}/{name}",
                }
            )
        resolved["mnist"]["cache_dir"] = f"{cache}/mnist" if cache else ""
        resolved["artifact_cache"] = {
            "dir": cache,
            "offline": offline,
            # How often the controller's filler tries a failed download, and how far apart (the artifacts
            # role's cache.yml reads them here, with the rest of the cache's settings).
            # (Their kind is checked with the other settings' before anything runs: tasks/specs.yml.)
            "retries": _whole(self.setting("artifact_cache_retries", 3)),
            "delay": _whole(self.setting("artifact_cache_delay", 10)),
            "downloads": downloads,
            # MindSpore's dependencies for the venv, fetched as wheels for the host's Python.
            "wheelhouse": f"{cache}/wheelhouse/{resolved['mindspore']['package']}-{resolved['mindspore']['version']}"
            if cache
            else "",
        }

    def require_checksums(self, resolved: dict[str, Any]) -> None:
        """Every file the chosen methods download must be pinned by a checksum (or be local).

        The catalog pins every file some public source gives a sha256 for; the rest carry
        `no_public_checksum` (why), which the refusal quotes with the steps to pin the user's copy."""
        chosen = [t["artifact"] for t in resolved["cuda"]["toolkits"]]
        chosen += [resolved[c].get("artifact", {}) for c in ("cudnn", "nccl", "tensorrt", "driver")]
        for artifact in chosen:
            if artifact.get("file") and not artifact.get("sha256") and not artifact.get("local_path"):
                name = artifact["file"]
                why = str(artifact.get("no_public_checksum") or "the catalog has no checksum for it").strip()
                where = f" from {artifact['url']}" if artifact.get("url") else ""
                self.error(
                    f"stack_artifact_checksums.{name}",
                    f"no public sha256 exists for {name}: {why}. Downloads are only trusted when pinned; "
                    f"allowed: download it{where}, run `sha256sum {name}` and add the sum to the "
                    f'inventory\'s group_vars as `stack_artifact_checksums: {{"{name}": <sum>}}`, or give '
                    f"the path of your copy on the controller in stack_local_artifacts",
                )

    def check_cuda_fit(self, component: str, version: str, entry: dict[str, Any], cuda_version: str) -> None:
        """Refuse a component version that was not built for the stack's CUDA."""
        if entry and cuda_version not in entry.get("cuda", []):
            fits = [v for v, e in self.catalog[component].items() if cuda_version in e.get("cuda", [])]
            self.error(
                f"stack_{component}_version",
                f"{DISPLAY[component]} {version} supports CUDA {_allowed(entry.get('cuda', []))}, not CUDA "
                f"{cuda_version}; allowed for CUDA {cuda_version}: {_allowed(fits)}",
            )

    def resolve_cudnn(
        self, stack: dict[str, Any], resolved: dict[str, Any], cuda_version: str, ms: dict[str, Any], art: Any
    ) -> None:
        version = self.version("cudnn", stack)
        entry = self.catalog["cudnn"].get(version, {})
        self.check_cuda_fit("cudnn", version, entry, cuda_version)
        if entry and ms and str(entry.get("major")) != str(ms.get("cudnn_major")):
            self.error(
                "stack_cudnn_version",
                f"{ms.get('package')} {resolved['mindspore']['version']} loads libcudnn.so.{ms.get('cudnn_major')}, "
                f"but cuDNN {version} is major {entry.get('major')}; allowed: a cuDNN {ms.get('cudnn_major')}.x",
            )
        method = self.method("cudnn", entry, version, stack)
        resolved["cudnn"] = {
            "version": version,
            "full_version": entry.get("full_version", ""),
            "major": str(entry.get("major", "")),
            "method": method,
            "disk_mb": entry.get("disk_mb", 0),
            "artifact": art(entry[method]) if method in entry else {},
        }

    def resolve_nccl(self, stack: dict[str, Any], resolved: dict[str, Any], cuda_version: str, art: Any) -> None:
        version = self.version("nccl", stack)
        entry = self.catalog["nccl"].get(version, {})
        self.check_cuda_fit("nccl", version, entry, cuda_version)
        if entry and version_key(version) < version_key(entry.get("minimum", "0")):
            self.error("stack_nccl_version", f"NCCL {version} is below the minimum {entry['minimum']}")
        method = self.method("nccl", entry, version, stack)
        resolved["nccl"] = {
            "version": version,
            "full_version": entry.get("full_version", ""),
            "method": method,
            "disk_mb": entry.get("disk_mb", 0),
            "artifact": art(entry[method]) if method in entry else {},
        }

    def resolve_serving(self, stack: dict[str, Any], resolved: dict[str, Any], art: Any) -> None:
        """MindSpore Serving: the release the stack names for its MindSpore, when stack_serving_enabled."""
        enabled = self.setting("serving_enabled", False)
        if not isinstance(enabled, bool):
            self.error("stack_serving_enabled", f"'{enabled}' is not a boolean; allowed: true, false")
            enabled = False
        version = str(stack.get("serving") or "")
        ms_version = resolved["mindspore"]["version"]
        releases = self.catalog.get("serving", {})
        with_serving = [
            name
            for name, s in self.catalog["stacks"].items()
            if s.get("serving") and str(s.get("mindspore")) in releases.get(str(s["serving"]), {}).get("mindspore", [])
        ]
        entry = releases.get(version, {})
        available = bool(entry) and ms_version in entry.get("mindspore", [])
        resolved["serving"] = {
            "enabled": False,
            "available": available,
            # The catalog's stacks that offer Serving (for the serving role's refusal).
            "offered_by": with_serving,
            "version": version if available else "",
            "package": entry.get("package", ""),
            "pins": list(entry.get("pins", [])),
            "dependencies": list(entry.get("dependencies", [])),
            "tensorrt_required": bool(entry.get("tensorrt_required", False)),
            "wheels": {
                tag: art(dict(w, package=entry.get("package"), version=version))
                for tag, w in entry.get("wheels", {}).items()
            }
            if available
            else {},
        }
        if not enabled:
            return
        if not available:
            why = (
                f"MindSpore Serving {version} serves MindSpore {_allowed(entry.get('mindspore', []))}, not "
                f"{ms_version} (stack_mindspore_version)"
                if entry
                else f"the stack '{resolved['name']}' has no MindSpore Serving release in the catalog"
            )
            self.error(
                "stack_serving_enabled",
                f"{why}; allowed: false, or a stack_name with Serving: {_allowed(with_serving)}",
            )
            return
        resolved["serving"]["enabled"] = True

    def resolve_tensorrt(self, stack: dict[str, Any], resolved: dict[str, Any], cuda_version: str, art: Any) -> None:
        enabled = self.setting("tensorrt_enabled", False)
        valid = isinstance(enabled, bool)
        if not valid:
            self.error("stack_tensorrt_enabled", f"'{enabled}' is not a boolean; allowed: true, false")
            enabled = False
        serving = resolved.get("serving", {})
        # Serving's GPU inference needs TensorRT: enabling Serving enables the stack's TensorRT.
        required_by_serving = bool(serving.get("enabled") and serving.get("tensorrt_required"))
        enabled = enabled or required_by_serving
        if not enabled:
            for name in ("tensorrt_version", "tensorrt_method") if valid else ():
                value = self.setting(name, "")
                if value != "":
                    self.error(
                        f"stack_{name}",
                        f"'{value}' is ignored: TensorRT is off (stack_tensorrt_enabled: false); "
                        "allowed: '' (the default), or stack_tensorrt_enabled: true",
                    )
            resolved["tensorrt"] = {"enabled": False, "disk_mb": 0}
            return
        version = self.version("tensorrt", stack)
        entry = self.catalog["tensorrt"].get(version, {})
        self.check_cuda_fit("tensorrt", version, entry, cuda_version)
        if entry and str(entry.get("cudnn_major")) != resolved["cudnn"]["major"]:
            self.error(
                "stack_tensorrt_version",
                f"TensorRT {version} needs cuDNN {entry.get('cudnn_major')}.x, "
                f"the stack has {resolved['cudnn']['version']}",
            )
        method = self.method("tensorrt", entry, version, stack)
        artifact = art(entry[method]) if method in entry else {}
        if artifact.get("files"):
            # A wheel per Python tag, each an artifact of its own (the controller's cache fetches the hosts'
            # ones once; stack_artifact_checksums and stack_local_artifacts name them by file).
            artifact["files"] = {
                tag: art({**wheel, **{k: artifact[k] for k in ("package", "version", "source") if k in artifact}})
                for tag, wheel in artifact["files"].items()
            }
        resolved["tensorrt"] = {
            "enabled": True,
            "required_by_serving": required_by_serving,
            "version": version,
            "method": method,
            "disk_mb": entry.get("disk_mb", 0),
            "artifact": artifact,
        }

    def auto_branch(self, stack: dict[str, Any], minimum: str) -> str:
        """stack_driver_branch: auto, before the host's GPUs are known: the newest catalog branch that has the
        chosen driver method and meets CUDA's minimum (the host preflight then picks per host among those)."""
        method = str(self.setting("driver_method", "") or stack.get("default_methods", {}).get("driver", ""))
        branches = self.catalog["driver"]
        fitting = [
            b
            for b in sorted(branches, key=version_key, reverse=True)
            if method in branches[b] and version_key(branches[b]["version"]) >= version_key(minimum)
        ]
        if not fitting:
            self.error(
                "stack_driver_branch",
                f"'auto' found no catalog branch with the driver method '{method}' whose driver meets the minimum "
                f"{minimum} of the stack's CUDA; allowed: {_allowed(b for b in branches if method in branches[b])} "
                "with another stack_driver_method, or a stack with an older CUDA",
            )
            return ""
        return fitting[0]

    def resolve_driver(
        self, stack: dict[str, Any], resolved: dict[str, Any], cuda_versions: list[str], art: Any
    ) -> None:
        branches = self.catalog["driver"]
        branch = self.text("driver_branch", str(stack["driver_branch"]))
        minimum = max(
            (self.catalog["cuda"][v]["minimum_driver"] for v in cuda_versions if v in self.catalog["cuda"]),
            key=version_key,
            default="0",
        )
        requested = branch
        if branch == "auto":
            branch = self.auto_branch(stack, minimum)
            if not branch:
                resolved["driver"] = {"branch": "auto", "requested": "auto", "minimum": minimum}
                return
        if branch not in branches:
            self.error(
                "stack_driver_branch", f"'{branch}' is not in the catalog; allowed: {_allowed(branches)}, or 'auto'"
            )
            resolved["driver"] = {"branch": branch}
            return
        entry = branches[branch]
        method = self.method("driver", entry, branch, stack)
        exact = self.setting("driver_version", "")
        if exact != "" and method != "runfile" and method in self.catalog["install_methods"]["driver"]:
            # distro and cuda_repo install the branch's packages: an exact release would be ignored.
            self.error(
                "stack_driver_version",
                f"'{exact}' is ignored by the driver method '{method}' (it installs branch {branch}'s packages); "
                "allowed: '' (the default), or stack_driver_method: runfile",
            )
            exact = ""
        version = self.text("driver_version", entry["version"]) if exact != "" else str(entry["version"])
        if method == "runfile" and version not in entry.get("runfile", {}):
            self.error(
                "stack_driver_version",
                f"no runfile for driver {version} in branch {branch}; allowed: {_allowed(entry.get('runfile', {}))}",
            )
        if version_key(version) < version_key(minimum):
            fits = [b for b, e in branches.items() if version_key(e["version"]) >= version_key(minimum)]
            self.error(
                "stack_driver_branch",
                f"driver {version} (branch {branch}) is below the minimum {minimum} that CUDA "
                f"{_allowed(cuda_versions)} needs; allowed: {_allowed(fits)}",
            )
        resolved["driver"] = {
            "branch": branch,
            # "auto": the preflight chooses the branch per host from its GPUs (roles/stack/tasks/host.yml).
            "requested": requested,
            "version": version,
            "method": method,
            "minimum": minimum,
            "packages": list(entry.get(method, {}).get("packages", [])) if method != "runfile" else [],
            "dkms_module": entry.get("distro", {}).get("dkms_module", "nvidia"),
            "artifact": art(entry["runfile"][version])
            if method == "runfile" and version in entry.get("runfile", {})
            else {},
        }


def local_pins(stacks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user's copies (stack_local_artifacts) of pinned files that these hosts' stacks install, each once:
    {file, path, sha256, pin, setting}, for artifact_cache.py --check-local in the preflight (artifacts role)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for stack in stacks:
        if not stack:
            continue
        for _component, _tag, art in _Resolver.chosen_artifacts(stack):
            if art.get("local_pin") and art.get("local_path"):
                found.setdefault(
                    (art["local_path"], art["sha256"]),
                    {
                        "file": art["file"],
                        "path": art["local_path"],
                        "sha256": art["sha256"],
                        "pin": art["local_pin"],
                        "setting": f"stack_local_artifacts.{art['file']}",
                    },
                )
    return [found[key] for key in sorted(found)]


def file_sha256(path: str) -> str:
    """The sha256 of a controller file (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# A wheel built for several CUDA versions (mindspore 2.x: plugin/gpu10.1/, plugin/gpu11.1/, libcuda_ops.so.10 and
# .so.11, libmindspore_gpu.so.11.6) loads only the libraries of the installed CUDA: the others do not count.
CUDA_IN_PATH = (
    re.compile(r"/gpu(\d+\.\d+)/"),
    re.compile(r"libmindspore_gpu\.so\.(\d+\.\d+)$"),
    re.compile(r"libcuda_ops\.so\.(\d+)$"),
)


def for_cuda(library: str, cuda_version: str) -> bool:
    """Whether a wheel's GPU library is one the stack's CUDA loads (one that names no CUDA version always is)."""
    for pattern in CUDA_IN_PATH:
        match = pattern.search(library)
        if match:
            named = match.group(1)
            return cuda_version == named or ("." not in named and cuda_version.split(".")[0] == named)
    return True


def stack_order(catalog: dict[str, Any]) -> list[str]:
    """The catalog's stacks as `stack_name: auto` tries them: verified on GPUs first; then those whose MindSpore
    wheel's GPU code was measured (catalog/gpu_code.yml) before those known from the build flags only; then the
    newest MindSpore (then CUDA) first."""
    stacks = catalog.get("stacks", {})
    measured = (catalog.get("gpu_code") or {}).get("mindspore") or {}

    def key(name: str) -> tuple[Any, ...]:
        entry = stacks[name]
        return (
            bool(entry.get("verified_on_gpu", False)),
            str(entry.get("mindspore", "")) in measured,
            version_key(str(entry.get("mindspore", ""))),
            version_key(str(entry.get("cuda", ""))),
        )

    return sorted(stacks, key=key, reverse=True)


def resolve_stack(catalog: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Resolve `settings` (stack_* variables without the prefix) against `catalog`.

    `name: auto`: the host preflight picks a stack per host from its GPUs (gpu_support.py: stack_for_gpus);
    before the GPUs are known, the first stack of stack_order() that the other settings fit stands in for it
    (its `requested_name` is "auto"); when none fits, the errors are the catalog default's."""
    if str(settings.get("name", "")).strip() == "auto":
        first: dict[str, Any] = {}
        for name in stack_order(catalog):
            result = resolve_stack(catalog, dict(settings, name=name))
            first = first or result
            if not result["errors"]:
                result["stack"]["requested_name"] = "auto"
                return result
        default = resolve_stack(catalog, dict(settings, name=catalog.get("default_stack", "")))
        default["errors"] = [
            f"stack_name: 'auto' found no catalog stack that the other stack_* settings fit; for the default "
            f"stack {catalog.get('default_stack')}: {error}"
            for error in default["errors"]
        ] or first.get("errors", [])
        return default
    resolver = _Resolver(catalog, settings)
    try:
        stack = resolver.resolve()
    except KeyError as exc:  # a malformed catalog is a bug in this project, not user input
        resolver.errors.append(f"catalog: entry {exc} is missing (catalog/stacks.yml is malformed)")
        stack = {}
    return {"errors": resolver.errors, "warnings": resolver.warnings, "stack": stack}


class FilterModule:
    """Ansible filter plugin entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "stack_resolve": resolve_stack,
            "stack_order": stack_order,
            "stack_version_key": version_key,
            "stack_local_pins": local_pins,
        }
