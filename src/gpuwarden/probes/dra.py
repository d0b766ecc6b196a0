"""DRA plugin probe: the kubelet's registration call and the plugin's own liveness call, in a killable child.

The kubelet's plugin watcher calls `GetInfo` on `<kubelet root>/plugins_registry/<driver>-reg.sock`;
before each pod it calls `NodePrepareResources` on the endpoint GetInfo names
(`plugins/<driver>/dra.sock`) and waits for it (kubelet 1.34 ff.: a deadline of minutes, and the pod
stays in ContainerCreating meanwhile). The NVIDIA DRA driver's liveness check sends exactly these
two: GetInfo and an empty NodePrepareResources (cmd/gpu-kubelet-plugin/health.go). Both are side-effect
free. This asks them with a deadline each, in a forked child killed at the overall deadline, so a
plugin that accepts the connection and never answers costs at most that deadline, never a hang.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.probes.bounded import Pending, start_func


def _row(r: Any, node_path: str) -> dict[str, Any]:
    return {"rpc": r.rpc.rsplit("/", 1)[-1], "service": r.rpc.rsplit("/", 1)[0], "socket": node_path,
            "status": r.status, "elapsed_s": round(r.elapsed_s, 3), "detail": r.detail, "timeout_s": r.timeout_s}


def probe_one(target: dict[str, str], timeout: float) -> dict[str, Any]:
    """One driver: GetInfo on its registration socket, then the empty NodePrepareResources on its
    service socket. `target` holds the node paths (`registration`, `service`) and where each is on
    this host (`registration_host`, `service_host`), resolved inside the node's root by the caller."""
    from gpuwarden.grpcapi import dra

    out: dict[str, Any] = {"driver": target["driver"], "registration": target.get("registration", ""),
                           "service": target.get("service", ""), "info": None, "calls": []}
    service = ""
    if target.get("registration_host"):
        r = dra.get_info(target["registration_host"], timeout)
        out["calls"].append(_row(r, target["registration"]))
        if r.ok and r.value is not None:
            i = r.value
            out["info"] = {"type": i.type, "name": i.name, "endpoint": i.endpoint,
                           "supported_versions": list(i.supported_versions)}
            if i.type != dra.DRA_PLUGIN_TYPE:  # a CSI registrar or another kind: not ours to call further
                return out
            service = i.dra_service
    if target.get("service_host"):
        r = dra.prepare(target["service_host"], [], service or dra.DRA_V1, timeout)
        if r.status == "unimplemented" and not service:  # an older plugin serving v1beta1 only
            r = dra.prepare(target["service_host"], [], dra.DRA_V1BETA1, timeout)
        out["calls"].append(_row(r, target["service"]))
    return out


def snapshot(targets: list[dict[str, str]], timeout: float) -> list[dict[str, Any]]:
    """Runs in the child: every driver's calls (plain data)."""
    return [probe_one(t, timeout) for t in targets]


def budget(targets: list[dict[str, str]], timeout: float) -> float:
    """The child's overall deadline: every call could time out (at most three per driver)."""
    return 3 * timeout * len(targets) + 1.0


def start(targets: list[dict[str, str]], timeout: float) -> Pending | None:
    """Start the probe now (None: no DRA socket to ask)."""
    if not targets:
        return None
    return start_func(snapshot, targets, timeout, timeout=budget(targets, timeout))
