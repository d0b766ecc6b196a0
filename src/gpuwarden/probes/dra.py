"""DRA plugin probe: the kubelet's registration call and the plugin's own liveness call, in a killable child.

The kubelet's plugin watcher calls `GetInfo` on `<kubelet root>/plugins_registry/<driver>-reg.sock`;
before each pod it calls `NodePrepareResources` on the endpoint GetInfo names
(`plugins/<driver>/dra.sock`) and waits for it (kubelet 1.34 ff.: a deadline of minutes, and the pod
stays in ContainerCreating meanwhile). The NVIDIA DRA driver's liveness check sends exactly these
two: GetInfo and an empty NodePrepareResources (cmd/gpu-kubelet-plugin/health.go). Both are side-effect
free. This asks them with a deadline each, in a child killed at the overall deadline, so a
plugin that accepts the connection and never answers costs at most that deadline, never a hang.

The child is a fresh interpreter (`python -m gpuwarden.probes.dra`), not a fork: the agent runs this
probe too, and it holds gRPC channels of its own (its plugin monitor); a forked copy of a process
that runs gRPC can deadlock in gRPC's own locks.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpuwarden.probes.bounded import ChildResult, run_cmd


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


#: the child's start (a fresh interpreter importing gRPC): 0.3 s on an idle host, 2.4 s measured on a
#: 2-core host at load 25; only a slow start spends it, a hung plugin costs its calls' deadlines
STARTUP_S = 10.0


def budget(targets: list[dict[str, str]], timeout: float) -> float:
    """The child's overall deadline: every call could time out (at most three per driver), plus its start."""
    return 3 * timeout * len(targets) + STARTUP_S


def run(targets: list[dict[str, str]], timeout: float) -> ChildResult | None:
    """Ask every target now, in a child with a hard deadline (None: no DRA socket to ask); the
    result's value is snapshot()'s list."""
    if not targets:
        return None
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pkg_parent, os.environ.get("PYTHONPATH")])))
    r = run_cmd([sys.executable, "-m", "gpuwarden.probes.dra", json.dumps({"targets": targets, "timeout": timeout})],
                budget(targets, timeout), env=env)
    value = []
    for line in r.stdout.splitlines():  # one driver a line, written as each is done: a killed child keeps its answers
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            value.append(doc)
    if r.status != "ok":
        return ChildResult(r.status, r.elapsed_s, value=value,
                           detail=(r.detail + ": " + r.stderr.strip()[-300:]).rstrip(": "))
    return ChildResult("ok", r.elapsed_s, value=value)


def main() -> None:
    """The child: argv[1] is {"targets": [...], "timeout": s}; prints each driver's result as a JSON line."""
    doc = json.loads(sys.argv[1])
    for t in doc["targets"]:
        print(json.dumps(probe_one(t, float(doc["timeout"]))), flush=True)


if __name__ == "__main__":
    main()
