"""DRA plugin probe: the kubelet's registration call and the plugin's own liveness call, in a killable child.

The kubelet's plugin watcher calls `GetInfo` on `<kubelet root>/plugins_registry/<driver>-reg.sock`;
before each pod it calls `NodePrepareResources` on the endpoint GetInfo names
(`plugins/<driver>/dra.sock`) and waits for it (kubelet 1.34 ff.: a deadline of minutes, and the pod
stays in ContainerCreating meanwhile). The NVIDIA DRA driver's liveness check sends exactly these
two: GetInfo and an empty NodePrepareResources (cmd/gpu-kubelet-plugin/health.go). Both are side-effect
free. This asks them in a child killed at one overall deadline, so a plugin that accepts the
connection and never answers costs at most that deadline, never a hang.

Every socket is opened beneath the node's root in this process, without following a link
(HostRoot.open_socket), before the child starts; the child inherits those fds and connects to
`/proc/self/fd/<n>` (confine.fd_address): the inode checked is the inode connected to, and no name
from the node's tree reaches gRPC's target parser, which percent-decodes `%2F` and cuts at `?` and
`#` (a directory named `x.y%2F..%2F..%2Ftmp%2Fevil.sock?` would connect outside the root).

The drivers are asked all at once (a thread per driver in the child, at most MAX_DRIVERS of them)
under one deadline for the whole probe: 32 plugins that accept and never answer cost one probe
timeout, not 32 of them.

The child is a fresh interpreter (`python -m gpuwarden.probes.dra`), not a fork: it runs gRPC in
threads, and the caller (the agent) may hold threads and locks of its own that a fork would copy.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from gpuwarden.probes.bounded import ChildResult, run_cmd

#: the sockets a target may name, each opened beneath the root and connected to through its fd
SOCKETS = ("registration", "service")
#: drivers asked at once (one thread each): facts.dra_probe asks at most this many
MAX_DRIVERS = 32
#: the v1beta1 retry is not started with less than this left of the call's deadline
MIN_CALL_S = 0.05
#: the child's start (a fresh interpreter importing gRPC): 0.3 s on an idle host, 2.4 s measured on a
#: 2-core host at load 25; only a slow start spends it, a hung plugin costs the probe's deadline
STARTUP_S = 10.0


def _row(r: Any, node_path: str) -> dict[str, Any]:
    return {"rpc": r.rpc.rsplit("/", 1)[-1], "service": r.rpc.rsplit("/", 1)[0], "socket": node_path,
            "status": r.status, "elapsed_s": round(r.elapsed_s, 3), "detail": r.detail, "timeout_s": r.timeout_s}


def _not_asked(rpc: str, node_path: str, why: str) -> dict[str, Any]:
    return {"rpc": rpc, "service": "", "socket": node_path, "status": "not asked", "elapsed_s": 0.0,
            "detail": why, "timeout_s": 0.0}


def head_start(timeout: float) -> float:
    """How long NodePrepareResources waits for GetInfo's answer (the service version, the plugin type)
    before it is asked anyway: a serving plugin answers GetInfo in milliseconds."""
    return min(0.25 * timeout, 1.0)


def probe_one(target: dict[str, str], timeout: float) -> dict[str, Any]:
    """One driver: GetInfo on its registration socket and the empty NodePrepareResources on its service
    socket, each with the deadline `timeout`; the prepare waits for GetInfo at most head_start(), so the
    driver costs at most that plus one timeout. `target` holds the node paths (`registration`,
    `service`), shown in the result, and the address of each (`registration_addr`, `service_addr`): an
    fd the caller opened beneath the node's root."""
    import threading

    from gpuwarden.grpcapi import dra

    out: dict[str, Any] = {"driver": target["driver"], "registration": target.get("registration", ""),
                           "service": target.get("service", ""), "info": None, "calls": []}
    for key, rpc in (("registration", "GetInfo"), ("service", "NodePrepareResources")):
        if target.get(f"{key}_error"):  # found, but not a socket when opened: nothing was connected to
            out["calls"].append(_not_asked(rpc, target.get(key, ""), target[f"{key}_error"]))
    got: list[Any] = []
    asker = None
    if target.get("registration_addr"):
        asker = threading.Thread(target=lambda: got.append(dra.get_info(target["registration_addr"], timeout)),
                                 daemon=True)
        asker.start()
        asker.join(head_start(timeout) if target.get("service_addr") else None)
    service = ""
    if got and got[0].ok and got[0].value is not None:
        if got[0].value.type != dra.DRA_PLUGIN_TYPE:  # a CSI registrar or another kind: not ours to call further
            return _with_info(out, got[0], target)
        service = got[0].value.dra_service
    prepared = None
    if target.get("service_addr"):
        t0 = time.monotonic()
        prepared = dra.prepare(target["service_addr"], [], service or dra.DRA_V1, timeout)
        left = timeout - (time.monotonic() - t0)
        if prepared.status == "unimplemented" and not service and left > MIN_CALL_S:  # an older plugin: v1beta1 only
            prepared = dra.prepare(target["service_addr"], [], dra.DRA_V1BETA1, left)
    if asker is not None:
        asker.join()  # bounded by its own deadline
        if got:
            _with_info(out, got[0], target)
    if prepared is not None:
        out["calls"].append(_row(prepared, target["service"]))
    return out


def _with_info(out: dict[str, Any], r: Any, target: dict[str, str]) -> dict[str, Any]:
    out["calls"].insert(0, _row(r, target["registration"]))
    if r.ok and r.value is not None:
        i = r.value
        out["info"] = {"type": i.type, "name": i.name, "endpoint": i.endpoint,
                       "supported_versions": list(i.supported_versions)}
    return out


def snapshot(targets: list[dict[str, str]], timeout: float, emit: Any = None) -> list[dict[str, Any]]:
    """Runs in the child: every driver's calls (plain data), all drivers at once (a thread each, at most
    MAX_DRIVERS); `emit(result)` is called as each driver is done."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(len(targets), MAX_DRIVERS)) as pool:
        futures = {pool.submit(probe_one, t, timeout): i for i, t in enumerate(targets)}
        done: dict[int, dict[str, Any]] = {}
        for f in as_completed(futures):
            done[futures[f]] = f.result()
            if emit is not None:
                emit(done[futures[f]])
    return [done[i] for i in sorted(done)]


def budget(targets: list[dict[str, str]], timeout: float) -> float:
    """The child's overall deadline: every driver is asked at once, each within head_start() and one
    call's deadline (probe_one), plus the child's start; it does not grow with the number of drivers."""
    return head_start(timeout) + timeout + 1.0 + STARTUP_S


def open_targets(root: Any, targets: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[int]]:
    """The targets with each socket opened beneath the root (HostRoot.open_socket) and its address set
    (`<key>_addr`), or why it was not (`<key>_error`: a link or not a socket); and the fds to pass to
    the child and close afterwards."""
    from gpuwarden import confine

    fds: list[int] = []
    out = []
    for t in targets:
        t = {k: v for k, v in t.items() if k in ("driver",) + SOCKETS}  # node paths only: nothing else is trusted
        for key in SOCKETS:
            if not t.get(key):
                continue
            try:
                fd = root.open_socket(t[key])
            except OSError as exc:
                t[f"{key}_error"] = f"not connected to: {exc.strerror or exc}"
                continue
            fds.append(fd)
            t[f"{key}_addr"] = confine.fd_address(fd)
        out.append(t)
    return out, fds


def run(root: Any, targets: list[dict[str, str]], timeout: float) -> ChildResult | None:
    """Ask every target now, in a child with a hard deadline (None: no DRA socket to ask); the
    result's value is snapshot()'s list. The sockets (node paths under the live `root`) are opened
    here, before the child starts, and the child connects only through those fds."""
    if not targets:
        return None
    opened, fds = open_targets(root, targets)
    try:
        pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pkg_parent, os.environ.get("PYTHONPATH")])))
        r = run_cmd([sys.executable, "-m", "gpuwarden.probes.dra", json.dumps({"targets": opened, "timeout": timeout})],
                    budget(opened, timeout), env=env, pass_fds=tuple(fds))
    finally:
        for fd in fds:
            os.close(fd)
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
    import threading

    doc = json.loads(sys.argv[1])
    lock = threading.Lock()

    def emit(result: dict[str, Any]) -> None:
        with lock:
            print(json.dumps(result), flush=True)

    snapshot(doc["targets"], float(doc["timeout"]), emit)


if __name__ == "__main__":
    main()
