"""The doctor: read a host's state and explain, in plain words, what keeps MindSpore off its GPUs.

Every rule reads real state (files under /, /proc and /sys, the env file's shell, the venv's
installed distributions, the ELF header of MindSpore's extension, `nvidia-smi -q` on a GPU host, unit
files merged as systemd merges them) and returns findings, each with an id, a severity (error,
warning, info), a title, the evidence (what was read, where) and the fix (plain words plus the exact
command or variable). Standard library only, Python 3.8.

The roots are parameters so that facts a container cannot have (a loaded nouveau or NVIDIA module,
Secure Boot's EFI variable, GPUs) can be given as a substituted file tree in tests; by default they
are the real /, /proc and /sys. nvidia-smi likewise: ``--nvidia-smi`` (or <root>/usr/bin/nvidia-smi
under a substituted root) can be a stand-in that prints a real GPU host's output. What the stack
expects (catalog values resolved by the `stack` role) comes from ``--expect FILE`` (JSON, written by
roles/verify tasks/doctor.yml).

One module per family of rules, run in this order by ``runner.diagnose``:

- ``kernel``: nouveau, dkms, secure-boot (the kernel's side of the driver);
- ``driver``: driver (the loaded module, libcuda and NVML against each other and the stack's minimum);
- ``persistence``: persistence (per GPU, and how systemd starts nvidia-persistenced: ``systemd``);
- ``gpu``: gpu-probe (what the framework-free GPU probe says); ``gpu_code``: compute (the stack's GPU code
  against the compute capability the probe reads);
- ``env``: env (the env file's shell); ``libraries``: libraries (where each library the wheel needs
  resolves); ``nccl``: nccl (which libnccl.so.2 MindSpore loads);
- ``packages``: python-packages (the venv's pins, MindSpore packages side by side);
- ``devices``: devices, mpi (which GPUs a process and each MPI rank use).

Shared by them: ``core`` (Finding, Host, the file readers), ``versions``, ``linker`` (ELF dynamic section,
linker cache and search order), ``systemd`` (units as systemd merges them) and ``probe_record`` (the GPU probe
run once through the judge, and the package's modules it needs). ``runner`` runs the rules and renders the
document; ``cli`` is the command line, which ``python -m msgpu_verify doctor``, ``python -m msgpu_verify.doctor``
and ``python3 <folder>/doctor`` (this folder run as a file, ``__main__``) all run. Every name below is importable
from ``msgpu_verify.doctor``.
"""

from __future__ import annotations

from .cli import DESCRIPTION, JSON_LINE, add_arguments, host_from_args, main, run
from .core import GPU_PROBE_TIMEOUT, SEVERITIES, Finding, Host, Rule, read_bytes, read_text
from .devices import gpu_count, mpi_ranks, rule_devices, rule_mpi
from .driver import NVRM_VERSION, loaded_driver_version, nvrm_version, rule_driver, user_space_driver
from .env import rule_env, shell_environment
from .gpu import CUDA_MEANINGS, PROBE_FIX_RERUN, cuda_code_text, rule_gpu_probe
from .gpu_code import rule_compute
from .kernel import (
    MODULE_SIGNATURE_MAGIC,
    MODULE_SUBDIRS,
    SECURE_BOOT_VAR,
    loaded_modules,
    module_signed,
    rule_dkms,
    rule_nouveau,
    rule_secure_boot,
    running_kernel,
)
from .libraries import PROVIDERS, mindspore_extension, provider, rule_libraries, rule_rpath_shadow
from .linker import MULTIARCH_DIRS, elf_dynamic, ld_cache, ld_conf_dirs, library_search
from .nccl import NCCL_SONAME, nccl_release, nccl_search, nccl_users, nccl_version, rule_nccl
from .packages import MINDSPORE_DISTRIBUTIONS, installed_distributions, rule_python_packages
from .persistence import (
    PERSISTENCED_DROPIN,
    PERSISTENCED_UNIT,
    gpu_persistence,
    nvidia_smi_program,
    nvidia_smi_query,
    persistence_mode_in,
    persistenced_processes,
    rule_persistence,
)
from .probe_record import (
    PROBE_FILES,
    driver_probe_runner,
    gpu_probe_record,
    probe_document,
    probe_line,
    probe_nvml_devices,
    sibling_module,
)
from .runner import RULES, diagnose, render
from .systemd import SYSTEMD_UNIT_DIRS, Unit, exec_argv, host_unit, load_unit, merge_unit, unit_assignments, unit_bool
from .versions import normalize, satisfies, split_requirement, version_key

__all__ = [
    "CUDA_MEANINGS",
    "DESCRIPTION",
    "GPU_PROBE_TIMEOUT",
    "JSON_LINE",
    "MINDSPORE_DISTRIBUTIONS",
    "MODULE_SIGNATURE_MAGIC",
    "MODULE_SUBDIRS",
    "MULTIARCH_DIRS",
    "NCCL_SONAME",
    "NVRM_VERSION",
    "PERSISTENCED_DROPIN",
    "PERSISTENCED_UNIT",
    "PROBE_FILES",
    "PROBE_FIX_RERUN",
    "PROVIDERS",
    "RULES",
    "SECURE_BOOT_VAR",
    "SEVERITIES",
    "SYSTEMD_UNIT_DIRS",
    "Finding",
    "Host",
    "Rule",
    "Unit",
    "add_arguments",
    "cuda_code_text",
    "diagnose",
    "driver_probe_runner",
    "elf_dynamic",
    "exec_argv",
    "gpu_count",
    "gpu_persistence",
    "gpu_probe_record",
    "host_from_args",
    "host_unit",
    "installed_distributions",
    "ld_cache",
    "ld_conf_dirs",
    "library_search",
    "load_unit",
    "loaded_driver_version",
    "loaded_modules",
    "main",
    "merge_unit",
    "mindspore_extension",
    "module_signed",
    "mpi_ranks",
    "nccl_release",
    "nccl_search",
    "nccl_users",
    "nccl_version",
    "normalize",
    "nvidia_smi_program",
    "nvidia_smi_query",
    "nvrm_version",
    "persistence_mode_in",
    "persistenced_processes",
    "probe_document",
    "probe_line",
    "probe_nvml_devices",
    "provider",
    "read_bytes",
    "read_text",
    "render",
    "rule_compute",
    "rule_devices",
    "rule_dkms",
    "rule_driver",
    "rule_env",
    "rule_gpu_probe",
    "rule_libraries",
    "rule_mpi",
    "rule_nccl",
    "rule_nouveau",
    "rule_persistence",
    "rule_python_packages",
    "rule_rpath_shadow",
    "rule_secure_boot",
    "run",
    "running_kernel",
    "satisfies",
    "shell_environment",
    "sibling_module",
    "split_requirement",
    "unit_assignments",
    "unit_bool",
    "user_space_driver",
    "version_key",
]
