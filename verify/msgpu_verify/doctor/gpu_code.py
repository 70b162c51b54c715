"""The compute rule: the stack's GPU code against the compute capability the GPU probe reads, by compute.py's
rule (judge.check_gpu_code)."""

from __future__ import annotations

import socket
from typing import Dict, List

from .core import Finding, Host
from .probe_record import gpu_probe_record, probe_document, sibling_module


def rule_compute(host: Host) -> List[Finding]:
    """The stack's GPU code (expect ``gpu_code``: stack_resolved.gpu_code, each component's measured SASS/PTX and
    documented compute-capability range) against the compute capability the GPU probe read for each GPU, by
    compute.py's rule (judge.check_gpu_code): a GPU the stack cannot run on is an error, a GPU it runs on only through
    the driver's PTX JIT or outside a library's support matrix a warning. Nothing without gpu_code, on a host without
    GPUs on purpose, or without the probe's compute capabilities."""
    components = host.expect.get("gpu_code")
    if not components or host.expect.get("no_gpu") or not probe_document(host):
        return []
    judge, _ = sibling_module("judge")
    compute, _ = sibling_module("compute")
    if judge is None or compute is None:
        return []
    stack = str(host.expect.get("stack") or "")
    name = str(host.expect.get("host") or socket.gethostname())
    result = judge.check_gpu_code(components, gpu_probe_record(host), name, stack)
    if result.get("state") != "checked":
        return []
    supports = f"the stack's libraries support: {result['supports']}"
    read = "compute capability from the GPU probe (gpu_probe.py: cuDeviceGetAttribute): " + "; ".join(
        "{} at {}: {}".format(g["id"], ", ".join(s for s in g["slots"] if s) or "?", compute.cc_text(g["cc"]))
        for g in result["gpus"]
    )
    findings: List[Finding] = []
    if result["errors"]:
        bad = [g for g in result["gpus"] if any(outcome == compute.NONE for outcome, _ in g["problems"])]
        findings.append(
            Finding(
                "gpu-unsupported",
                "error",
                f"Stack {stack or '?'} cannot run on {sum(len(g['slots']) for g in bad)} GPU(s) of this host: "
                + ", ".join(f"{g['id']} (compute capability {compute.cc_text(g['cc'])})" for g in bad),
                [*result["errors"], read, supports],
                "stack_name: auto picks a catalog stack that runs here (the preflight, playbooks/preflight.yml, "
                "changes nothing and says which and why), or set stack_name to a stack whose MindSpore, CUDA, cuDNN "
                "and TensorRT support this GPU (catalog/stacks.yml, `gpu:` of each version); then "
                "`./toolkit provision`.",
            )
        )
    # compute.check writes one warning per JIT / outside-the-matrix problem, GPU by GPU in its problems' order.
    warnings = iter(result["warnings"])
    kinds: Dict[str, List[str]] = {compute.JIT: [], compute.OUTSIDE: [], compute.SINGLE: [], compute.UNKNOWN: []}
    for entry in result["gpus"]:
        for outcome, why in entry["problems"]:
            if outcome in kinds:
                kinds[outcome].append(next(warnings, why))
    if kinds[compute.JIT]:
        findings.append(
            Finding(
                "gpu-jit-only",
                "warning",
                f"Stack {stack or '?'} runs on some of this host's GPUs only through the driver's PTX JIT: each "
                "user's first start compiles for minutes",
                [*kinds[compute.JIT], read, supports],
                "Nothing is broken: the driver compiles the PTX once per user and keeps it in the kernel cache "
                "(~/.nv/ComputeCache; CUDA_CACHE_MAXSIZE of at least 2 GiB, the env file sets it), and the verify "
                "role's warm-up pays it before anything is timed. stack_name: auto picks a catalog stack with native "
                "code for this GPU where there is one.",
            )
        )
    if kinds[compute.OUTSIDE]:
        findings.append(
            Finding(
                "gpu-outside-matrix",
                "warning",
                f"Stack {stack or '?'} runs on some of this host's GPUs outside its libraries' support matrix "
                "(same-architecture code, untuned, not verified by NVIDIA)",
                [*kinds[compute.OUTSIDE], read, supports],
                "It runs, possibly slower than a stack built for this GPU. stack_name: auto picks a catalog stack "
                "whose libraries list this GPU where there is one.",
            )
        )
    if kinds[compute.SINGLE]:
        findings.append(
            Finding(
                "gpu-single-only",
                "warning",
                f"Stack {stack or '?'} runs on this host's one GPU, but its NCCL has no code for it: multi-GPU and "
                "multi-host (mpirun) training cannot run here",
                [*kinds[compute.SINGLE], read, supports],
                "Single-GPU training runs. For distributed training this GPU needs an NCCL built for its "
                "architecture, which no stack of the catalog has (docs/gpu-evidence.md); a host with several such "
                "GPUs is refused by the preflight.",
            )
        )
    if kinds[compute.UNKNOWN]:
        findings.append(
            Finding(
                "gpu-code-unknown",
                "warning",
                f"Stack {stack or '?'} has components whose GPU code the catalog does not record: not checked "
                "against this host's GPUs",
                [*kinds[compute.UNKNOWN], read, supports],
                "Nothing to do on the host; the judge (`./toolkit verify`) shows whether MindSpore computes on the "
                "GPU. The catalog's `gpu:` of that component's version (catalog/stacks.yml) or its measured code "
                "(catalog/gpu_code.yml) would let this check judge it.",
            )
        )
    return findings
