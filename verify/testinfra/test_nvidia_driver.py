"""NVIDIA driver: nouveau blacklisted, and the DKMS module built and installed for every kernel that
has headers — including kernels whose headers arrived after the driver — whichever install method
the host's stack uses:

- distro: the branch's Ubuntu packages, installed and held;
- runfile: NVIDIA's runfile (--silent --dkms), its uninstaller, no driver package, and apt pinned
  so that none is installed over it;
- cuda_repo: NVIDIA's cuda-drivers-<branch> metapackage and the driver packages it pulls in, held.

Persistence mode: nvidia-persistenced's unit, as systemd merges it (unit file plus drop-ins), starts
the daemon with --persistence-mode and does not stop it when unneeded, whichever method.
"""

from __future__ import annotations

import re
import sys

import pytest
from conftest import CATALOG, ROOT

sys.path.insert(0, str(ROOT / "verify"))
from msgpu_verify import doctor  # the doctor's unit merge (standard library only)

DEFAULT_STACK = CATALOG["stacks"][CATALOG["default_stack"]]
DEFAULT_BRANCH = CATALOG["driver"][DEFAULT_STACK["driver_branch"]]
DKMS_LINE = re.compile(r"^[^,]+, [^,]+, ([^,]+), [^:]+: installed", re.MULTILINE)
RUNFILE_MARKER = "/var/lib/msgpu/nvidia-driver-runfile.sha256"
RUNFILE_APT_PIN = "/etc/apt/preferences.d/msgpu-nvidia-driver-runfile.pref"
RUNFILE_PERSISTENCED_UNIT = "/etc/systemd/system/nvidia-persistenced.service"
# Ubuntu's unit (nvidia-compute-utils-<branch>), which the distro and cuda_repo methods install.
PACKAGED_PERSISTENCED_UNITS = (
    "/lib/systemd/system/nvidia-persistenced.service",
    "/usr/lib/systemd/system/nvidia-persistenced.service",
)
# cuDriverGetVersion() needs no GPU: the driver API version libcuda implements (e.g. 11040).
CUDA_DRIVER_VERSION = (
    "import ctypes; lib = ctypes.CDLL('libcuda.so.1'); v = ctypes.c_int(); "
    "rc = lib.cuDriverGetVersion(ctypes.byref(v)); print(rc, v.value)"
)


def method_is(stack: dict, *methods: str) -> None:
    if stack["driver"]["method"] not in methods:
        pytest.skip(f"only for the {'/'.join(methods)} method (this host: {stack['driver']['method']})")


def selection(host, package: str) -> tuple[str, str]:
    name, chosen = host.check_output(f"dpkg --get-selections {package}").split()
    return name.split(":")[0], chosen  # multi-arch packages print name:amd64


def depends(host, package: str) -> list[str]:
    out = host.check_output(f"dpkg-query --show --showformat='${{Depends}}' {package}")
    return sorted({re.sub(r"[ (:|].*$", "", d.strip()) for d in out.split(",") if d.strip()})


def persistenced_unit(host) -> doctor.Unit:
    """nvidia-persistenced.service as systemd would merge it, read from the host's files: systemd is not
    PID 1 in the test containers, so `systemctl show` has no manager to ask."""

    def list_dir(folder: str) -> list[str]:
        entry = host.file(folder)
        return entry.listdir() if entry.is_directory else []

    def read(path: str) -> str | None:
        entry = host.file(path)
        return entry.content_string if entry.exists or entry.is_symlink else None

    return doctor.load_unit(doctor.PERSISTENCED_UNIT, list_dir, read)


def assert_persistence_mode_on(unit: doctor.Unit) -> list[str]:
    """The merged unit starts the daemon with persistence mode and keeps it running; its argv."""
    starts = unit.values("Service", "ExecStart")
    assert len(starts) == 1, (unit.sources, starts)  # Type=forking: exactly one command line
    argv = doctor.exec_argv(starts[0])
    assert argv[0] == "/usr/bin/nvidia-persistenced", (unit.sources, argv)
    assert "--persistence-mode" in argv and "--no-persistence-mode" not in argv, (unit.sources, argv)
    assert argv[1:3] == ["--user", "nvidia-persistenced"], argv
    assert not doctor.unit_bool(unit.value("Unit", "StopWhenUnneeded")), (unit.sources, unit.settings)
    return argv


def kernels_with_headers(host) -> list[str]:
    out = host.check_output("for d in /lib/modules/*; do [ -e $d/build/Makefile ] && basename $d; done; true")
    return out.split()


@pytest.mark.parametrize("package", DEFAULT_BRANCH["distro"]["packages"])
def test_driver_package_installed_and_held(host, stack, package):
    method_is(stack, "distro")
    assert host.package(package).is_installed
    assert selection(host, package) == (package, "hold")


def test_packages_match_the_stack(host, stack):
    """The driver packages on the host are those of the stack's method: every package the stack lists
    (distro: the branch's Ubuntu packages; cuda_repo: cuda-drivers-<branch>) is installed; the runfile
    method lists none, and none of the branch's packages, of either method, is installed."""
    driver = stack["driver"]
    branch = CATALOG["driver"][driver["branch"]]
    if driver["method"] == "runfile":
        assert driver["packages"] == [], driver["packages"]
        packaged = [*branch["distro"]["packages"], *branch.get("cuda_repo", {}).get("packages", [])]
        assert packaged, f"the catalog lists no package for driver branch {driver['branch']}"
        installed = [package for package in packaged if host.package(package).is_installed]
        assert installed == [], f"driver packages installed next to the runfile's driver: {installed}"
    else:
        assert driver["packages"], f"the stack lists no package for the {driver['method']} driver"
        missing = [package for package in driver["packages"] if not host.package(package).is_installed]
        assert missing == [], f"driver packages of the stack not installed: {missing}"


def test_cuda_repo_metapackage_and_its_driver_packages_are_held(host, stack, subtests):
    method_is(stack, "cuda_repo")
    for package in stack["driver"]["packages"]:
        assert host.package(package).is_installed, package
        assert selection(host, package) == (package, "hold")
        pulled_in = depends(host, package)
        assert pulled_in, f"{package} depends on no driver package"
        for dependency in pulled_in:
            with subtests.test(msg=dependency):
                assert host.package(dependency).is_installed
                assert selection(host, dependency) == (dependency, "hold")


def test_runfile_install_is_complete(host, host_vars, stack):
    """The marker (written last) holds the sha256 of the runfile that was installed."""
    method_is(stack, "runfile")
    marker = host.file(RUNFILE_MARKER)
    assert marker.is_file and marker.user == "root" and marker.mode == 0o644
    pinned = stack["driver"]["artifact"].get("sha256")  # known when the inventory pins it
    assert re.fullmatch(pinned or "[0-9a-f]{64}", marker.content_string.strip())
    assert host.file("/usr/bin/nvidia-uninstall").exists
    assert "nvidia-installer log file" in host.file("/var/log/nvidia-installer.log").content_string
    # Once the marker is written the host keeps no copy of the runfile (the role removes it).
    folder = host_vars.get("nvidia_driver_artifact_dir", "/var/cache/msgpu/artifacts")
    runfile = f"{folder}/{stack['driver']['artifact']['file']}"
    assert not host.file(runfile).exists, f"{runfile}: the installed runfile is still on the host"


def test_runfile_install_has_no_driver_package(host, stack):
    method_is(stack, "runfile")
    installed = host.check_output("dpkg-query --show --showformat='${db:Status-Abbrev} ${Package}\\n'")
    packages = [line.split()[1] for line in installed.splitlines() if line.startswith("ii")]
    driver = re.compile(
        r"^(nvidia-(dkms|utils|compute-utils|kernel-source|driver)-\d+|libnvidia-compute-\d+|cuda-drivers)"
    )
    assert [p for p in packages if driver.match(p)] == []


def test_runfile_install_keeps_apt_from_installing_driver_packages(host, stack, settings):
    method_is(stack, "runfile")
    pin = host.file(RUNFILE_APT_PIN)
    if settings.get("driver_hold", True) is False:
        pytest.skip("nvidia_driver_hold is false")
    assert pin.is_file and pin.user == "root" and pin.mode == 0o644
    for package in CATALOG["driver"][stack["driver"]["branch"]]["distro"]["packages"]:
        policy = host.check_output(f"apt-cache policy {package}")
        assert "Candidate: (none)" in policy, policy


def test_runfile_install_has_a_persistenced_unit(host, stack):
    method_is(stack, "runfile")
    unit = host.file(RUNFILE_PERSISTENCED_UNIT)
    assert unit.is_file and unit.user == "root" and unit.mode == 0o644
    assert "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced" in unit.content_string
    assert host.file("/usr/bin/nvidia-persistenced").mode & 0o111
    assert host.user("nvidia-persistenced").exists
    # The role's own unit, with no drop-in (that one is for Ubuntu's unit), runs persistence mode.
    merged = persistenced_unit(host)
    assert merged.path == RUNFILE_PERSISTENCED_UNIT and merged.dropins == [], merged.sources
    assert_persistence_mode_on(merged)
    assert not host.file(doctor.PERSISTENCED_DROPIN).exists


def test_packaged_persistenced_unit_runs_persistence_mode(host, stack, host_vars):
    """distro and cuda_repo: Ubuntu's unit says --no-persistence-mode and StopWhenUnneeded=true; with the
    role's drop-in the unit systemd loads says --persistence-mode and StopWhenUnneeded=false."""
    method_is(stack, "distro", "cuda_repo")
    if host_vars.get("nvidia_driver_persistence_mode", True) is False:
        pytest.skip("nvidia_driver_persistence_mode is false")
    dropin = host.file(doctor.PERSISTENCED_DROPIN)
    assert dropin.is_file and dropin.user == "root" and dropin.group == "root" and dropin.mode == 0o644
    folder = host.file(doctor.PERSISTENCED_DROPIN.rsplit("/", 1)[0])
    assert folder.is_directory and folder.user == "root" and folder.mode == 0o755
    unit = persistenced_unit(host)
    assert unit.path in PACKAGED_PERSISTENCED_UNITS, unit.sources  # the package's, not one of the role's
    packaged = host.file(unit.path).content_string
    assert "--no-persistence-mode" in packaged and "StopWhenUnneeded=true" in packaged  # what the drop-in undoes
    assert doctor.PERSISTENCED_DROPIN in unit.dropins, unit.sources
    assert_persistence_mode_on(unit)
    assert unit.values("Install", "WantedBy") == ["multi-user.target"]  # `systemctl enable` works
    assert host.user("nvidia-persistenced").exists  # the package's postinst creates it


def test_module_sources_are_registered_with_dkms(host, stack):
    status = host.check_output(f"dkms status -m {stack['driver']['dkms_module']}")
    versions = set(re.findall(r"^[^,/]+[,/] *([^,:]+)", status, re.MULTILINE))
    assert len(versions) == 1, status  # one driver, not an old one left behind
    assert host.file(f"/usr/src/{stack['driver']['dkms_module']}-{versions.pop()}/dkms.conf").is_file


def test_libcuda_implements_every_installed_cuda_version(host, stack):
    """libcuda loads and reports its driver API version, which must cover every toolkit of the stack."""
    rc, version = host.check_output(f'python3 -c "{CUDA_DRIVER_VERSION}"').split()
    assert rc == "0"
    for toolkit in stack["cuda"]["toolkits"]:
        major, minor = toolkit["version"].split(".")[:2]
        assert int(version) >= int(major) * 1000 + int(minor) * 10, (version, toolkit["version"])


def test_every_kernel_with_headers_has_the_module(host, stack):
    kernels = kernels_with_headers(host)
    assert kernels, "no kernel headers installed"
    built = DKMS_LINE.findall(host.check_output(f"dkms status -m {stack['driver']['dkms_module']}"))
    assert sorted(built) == sorted(kernels)


def test_module_files_exist_for_every_kernel(host, stack):
    for kernel in kernels_with_headers(host):
        module = host.file(f"/lib/modules/{kernel}/updates/dkms/{stack['driver']['dkms_module']}.ko")
        assert module.is_file, module.path


def test_module_version_is_the_branch(host, stack):
    kernel = kernels_with_headers(host)[0]
    version = host.check_output(f"modinfo -k {kernel} -F version {stack['driver']['dkms_module']}")
    assert version.split(".")[0] == stack["driver"]["branch"]


def test_nouveau_is_blacklisted(host):
    conf = host.file("/etc/modprobe.d/blacklist-nouveau.conf")
    assert conf.is_file and conf.user == "root" and conf.mode == 0o644
    assert "blacklist nouveau" in conf.content_string


def test_libcuda_is_in_the_linker_cache(host):
    assert "libcuda.so.1" in host.check_output("ldconfig -p")


def test_nvidia_smi_is_installed(host):
    assert host.exists("nvidia-smi")
