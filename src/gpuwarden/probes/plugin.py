"""Device-plugin probe for `check`: the kubelet's own calls to each plugin socket, in a killable child.

The kubelet calls GetPreferredAllocation (then Allocate) at every GPU pod admission with no
deadline; in the NVIDIA plugin only GetPreferredAllocation reaches NVML, so a plugin whose NVML
hangs answers GetDevicePluginOptions and ListAndWatch and hangs there (incident 5a, measured with
the real plugin: docs/validation.md run 4). This asks the same three, side-effect-free calls with
a deadline each, in a forked child killed at the overall deadline, so `check` reports the hang
without a kubelet log at --v=4. The agent does the same from its plugin monitor instead
(agent/monitors.py), so it leaves this probe off (Settings.plugin_probe).
"""

from __future__ import annotations

from typing import Any

from gpuwarden.probes.bounded import Pending, start_func


def snapshot(sockets: list[str], timeout: float) -> list[dict[str, Any]]:
    """Runs in the child: per plugin socket, each call's status, time and detail (plain data)."""
    from gpuwarden.grpcapi import client

    out = []
    for sock in sockets:
        calls = []
        r = client.plugin_options(sock, timeout)
        calls.append(r)
        if r.status != "timeout":
            lw = client.plugin_first_list(sock, timeout)
            calls.append(lw)
            ids = [d.id for d in lw.value or () if d.healthy] or [d.id for d in lw.value or ()]
            if r.ok and r.value is not None and r.value.get_preferred_allocation_available and ids:
                calls.append(client.plugin_preferred_allocation(sock, ids, 1, timeout=timeout))
        out.append({"socket": sock, "calls": [{"rpc": c.rpc.rsplit("/", 1)[-1], "status": c.status,
                                               "elapsed_s": round(c.elapsed_s, 3), "detail": c.detail,
                                               "timeout_s": c.timeout_s} for c in calls]})
    return out


def start(socket_dir: str, timeout: float) -> Pending | None:
    """Start the probe now (None: no plugin socket to ask); at most three calls per socket, each
    bounded by `timeout`, the child killed after all of them could have timed out."""
    from gpuwarden.grpcapi.sockets import plugin_socket_paths

    sockets = plugin_socket_paths(socket_dir)  # cheap: a listing and stat(2), no grpc in this process
    if not sockets:
        return None
    return start_func(snapshot, sockets, timeout, timeout=3 * timeout * len(sockets) + 1.0)
