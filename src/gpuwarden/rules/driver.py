"""Driver and host software: the NVIDIA stack below Kubernetes."""

from __future__ import annotations

from typing import Iterator

from gpuwarden.facts import NodeFacts
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.rules.base import Hit, rule


@rule(
    "GPU-DRV-006",
    title="NVML hangs (nvmlInit / nvidia-smi does not return)",
    severity=Severity.CRITICAL,
    family="driver",
    needs=("probes",),
    automation="A2 (cordon; drain; driver reload or reboot)",
    remedy="""
        1. Cordon the node so no new GPU pods land on it; anything that calls NVML (device plugin,
           DCGM, nvidia-smi, kubelet's plugin calls) will block too.
        2. Look for D-state processes (`ps -eo pid,stat,wchan:32,cmd | awk '$2 ~ /D/'`) and NVRM/Xid lines
           in the kernel log; collect `nvidia-bug-report.sh` if it can run.
        3. Recover by draining and rebooting (or reloading the driver when nothing holds it). With MIG on
           driver 570.124.06-570.158.01, upgrade to >= 570.172.08 (see GPU-K8S-001).
    """,
    references=(
        "incident 5 (shared/incidents/5-mig-nvml-hang-kubelet-blocked.zh.md)",
        "NVIDIA/go-nvml#152", "NVIDIA/gpu-operator#1361",
    ),
)
def nvml_hang(facts: NodeFacts) -> Iterator[Hit]:
    """An NVML call that does not return blocks every GPU agent on the node.

    gpuwarden runs nvmlInit and a per-GPU snapshot in a child process with a
    hard deadline (--probe-timeout, default 5 s). A child that does not answer in
    time is killed and the hang itself is the finding; a driver that answers with
    an error is not a hang (other rules read the error).
    """
    probes = facts.get("probes")
    n = probes.nvml
    if n is None or n.status != "timeout":
        return
    yield Hit(
        Status.CONFIRMED,
        f"nvmlInit/NVML queries did not return within {n.elapsed_s:.1f}s; the probe child was killed. "
        "Anything on this node that calls NVML will hang the same way.",
        affected=[Affected("node", "nvml")],
        evidence=[Evidence("probe nvml" + (" (recorded)" if probes.recorded else ""), n.detail or "timeout")],
        data={"elapsed_s": round(n.elapsed_s, 3)},
    )
