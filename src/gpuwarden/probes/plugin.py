"""Device-plugin probe for `check`: the kubelet's own calls to each plugin socket, in a killable child.

The kubelet calls GetPreferredAllocation (then Allocate) at every GPU pod admission with no
deadline; in the NVIDIA plugin only GetPreferredAllocation reaches NVML, so a plugin whose NVML
hangs answers GetDevicePluginOptions and ListAndWatch and hangs there (incident 5a, measured with
the real plugin: docs/validation.md run 4). This asks the same three, side-effect-free calls with
a deadline each, in a forked child killed at the overall deadline, so `check` reports the hang
without a kubelet log at --v=4. The agent does the same from its plugin monitor instead
(agent/monitors.py), so it leaves this probe off (Settings.plugin_probe).

Each socket is opened beneath the node's root without following a link (open_sockets) and connected
to through that fd (confine.fd_address), which the forked child inherits: a socket under the root
that is a link to one outside is never connected to (docs/security.md).
"""

from __future__ import annotations

import os
from typing import Any

from gpuwarden import confine
from gpuwarden.grpcapi.sockets import discover_plugin_sockets
from gpuwarden.probes.bounded import Pending, start_func


def open_sockets(root: Any, socket_dir: str) -> list[tuple[str, int]]:
    """(node path, O_PATH fd) of each plugin socket in the node directory `socket_dir`, opened beneath
    the root (HostRoot.open_socket); a link or a non-socket is left out. The caller closes the fds."""
    names = root.listdir(socket_dir)
    out: list[tuple[str, int]] = []
    if not isinstance(names, list):
        return out
    for name in discover_plugin_sockets(names):
        path = f"{socket_dir.rstrip('/')}/{name}"
        try:
            out.append((path, root.open_socket(path)))
        except OSError:
            continue
    return out


def close_all(opened: list[tuple[str, int]]) -> None:
    for _, fd in opened:
        os.close(fd)


def snapshot(sockets: list[tuple[str, str]], timeout: float) -> list[dict[str, Any]]:
    """Runs in the child: per plugin socket (its node path, the address to connect to), each call's
    status, time and detail (plain data)."""
    from gpuwarden.grpcapi import client

    out = []
    for shown, sock in sockets:
        calls = []
        r = client.plugin_options(sock, timeout)
        calls.append(r)
        if r.status != "timeout":
            lw = client.plugin_first_list(sock, timeout)
            calls.append(lw)
            ids = [d.id for d in lw.value or () if d.healthy] or [d.id for d in lw.value or ()]
            if r.ok and r.value is not None and r.value.get_preferred_allocation_available and ids:
                calls.append(client.plugin_preferred_allocation(sock, ids, 1, timeout=timeout))
        out.append({"socket": shown, "calls": [{"rpc": c.rpc.rsplit("/", 1)[-1], "status": c.status,
                                               "elapsed_s": round(c.elapsed_s, 3), "detail": c.detail,
                                               "timeout_s": c.timeout_s} for c in calls]})
    return out


def start(root: Any, socket_dir: str, timeout: float) -> Pending | None:
    """Start the probe now (None: no plugin socket to ask); at most three calls per socket, each
    bounded by `timeout`, the child killed after all of them could have timed out. `socket_dir` is
    a node path under the live root `root`."""
    opened = open_sockets(root, socket_dir)  # cheap: a listing and an open per socket, no grpc in this process
    if not opened:
        return None
    try:
        sockets = [(path, confine.fd_address(fd)) for path, fd in opened]
        return start_func(snapshot, sockets, timeout, timeout=3 * timeout * len(sockets) + 1.0)
    finally:
        close_all(opened)  # the child holds its own copies
