"""A kubelet stand-in for DRA: registers a real DRA kubelet plugin and prepares claims as the kubelet does.

It is the kubelet's plugin watcher and DRA manager (kubernetes pkg/kubelet/pluginmanager,
pkg/kubelet/cm/dra) reduced to what a plugin and gpuwarden can observe, built on the protos
gpuwarden ships (gpuwarden.grpcapi.dra):

- `register(driver)`: the plugin watcher's handshake on `<kubelet root>/plugins_registry/<driver>-reg.sock`:
  GetInfo, check the type is DRAPlugin and a DRA service is offered (v1 preferred, as the kubelet),
  then NotifyRegistrationStatus(registered=true); the endpoint GetInfo names is the dra.sock to call.
- `prepare(driver, pod_uid, claims)`: NodePrepareResources with the pod's claims (namespace, UID,
  name of ResourceClaims that exist in the API, allocated to this node), then the kubelet's claim
  checkpoint `<kubelet root>/dra_manager_state` in its v1 layout ({"Data": "<DRACheckpoint JSON>",
  "Checksum"}; the checksum is written as 0, gpuwarden does not verify it), one entry per claim with
  the devices and CDI device IDs the plugin answered. `unprepare` is the reverse. The kubelet calls
  these with a deadline (`timeout`), as since 1.34; a caller that wants the older unbounded wait
  passes None.
- `cdi_device_nodes(ids)`: what the container runtime does with the CDI device IDs: find each
  device in the CDI specs (`/etc/cdi`, `/var/run/cdi`; a later directory wins for the same kind),
  merge the spec's and the device's containerEdits and return their device nodes, major/minor filled
  from the host node when the spec leaves them out. A node the spec does not name is not in the
  container, whatever the host has: incident 1 in DRA form.

What it is not: no pod lifecycle, no retries, no claim informer (the caller passes the claims).
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from gpuwarden.grpcapi import dra

CHECKPOINT = "dra_manager_state"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


class StandInError(Exception):
    """A step the kubelet would fail (and retry) on; the message says which and why."""


@dataclass
class Registered:
    driver: str
    info: dra.PluginInfo
    service: str  # the DRA gRPC service chosen
    endpoint: str  # the dra.sock path


@dataclass
class ClaimEntry:
    uid: str
    name: str
    namespace: str
    pod_uids: set[str] = field(default_factory=set)
    devices: dict[str, list[dra.PreparedDevice]] = field(default_factory=dict)  # driver -> devices


class KubeletDra:
    def __init__(self, kubelet_root: str | os.PathLike[str] = "/var/lib/kubelet",
                 cdi_dirs: Iterable[str] = CDI_DIRS, timeout: float | None = 45.0) -> None:
        self.root = Path(kubelet_root)
        self.cdi_dirs = tuple(cdi_dirs)
        self.timeout = timeout
        self.plugins: dict[str, Registered] = {}
        self.claims: dict[str, ClaimEntry] = {}
        self.log: list[str] = []  # what it did, one line per call, for the scenario's record

    def _t(self, timeout: float | None) -> float:
        t = self.timeout if timeout is None else timeout
        return t if t else 10 * 365 * 86400.0  # "no deadline" as the older kubelets: a very long one

    # -- registration ----------------------------------------------------------------------------
    def register(self, driver: str, timeout: float | None = None) -> Registered:
        reg = self.root / "plugins_registry" / f"{driver}-reg.sock"
        r = dra.get_info(str(reg), self._t(timeout))
        self.log.append(f"GetInfo {reg}: {r.status} {r.detail if not r.ok else r.value}")
        if not r.ok or r.value is None:
            raise StandInError(f"GetInfo on {reg}: {r.status}: {r.detail}")
        info = r.value
        problem = ("" if info.type == dra.DRA_PLUGIN_TYPE else f"type {info.type!r} is not DRAPlugin") or \
                  ("" if info.dra_service else f"no supported DRA service in {list(info.supported_versions)}") or \
                  ("" if info.name == driver else f"name {info.name!r} is not {driver!r}")
        n = dra.notify_registration(str(reg), not problem, problem, self._t(timeout))
        self.log.append(f"NotifyRegistrationStatus registered={not problem}: {n.status}")
        if problem:
            raise StandInError(f"{driver}: {problem}")
        endpoint = info.endpoint or str(self.root / "plugins" / driver / "dra.sock")
        self.plugins[driver] = Registered(driver, info, info.dra_service, endpoint)
        return self.plugins[driver]

    # -- claims ----------------------------------------------------------------------------------
    def prepare(self, driver: str, pod_uid: str, claims: list[tuple[str, str, str]],
                timeout: float | None = None) -> dict[str, dra.ClaimResult]:
        """NodePrepareResources for one pod's claims (namespace, uid, name); raises StandInError when the
        call fails or a claim reports an error (the kubelet then fails the pod's sandbox and retries)."""
        p = self._plugin(driver)
        t0 = time.monotonic()
        r = dra.prepare(p.endpoint, claims, p.service, self._t(timeout))
        self.log.append(f"NodePrepareResources {[c[1] for c in claims]}: {r.status} in {time.monotonic() - t0:.3f}s"
                        + (f" ({r.detail})" if not r.ok else ""))
        if not r.ok or r.value is None:
            raise StandInError(f"NodePrepareResources on {p.endpoint}: {r.status}: {r.detail}")
        got = {c.uid: c for c in r.value}
        for ns, uid, name in claims:
            res = got.get(uid)
            if res is None:
                raise StandInError(f"NodePrepareResources left claim {ns}/{name} ({uid}) out of its answer")
            if res.error:
                raise StandInError(f"claim {ns}/{name}: {res.error}")
            e = self.claims.setdefault(uid, ClaimEntry(uid, name, ns))
            e.pod_uids.add(pod_uid)
            e.devices[driver] = list(res.devices)
        self.write_checkpoint()
        return got

    def unprepare(self, driver: str, claims: list[tuple[str, str, str]],
                  timeout: float | None = None) -> dict[str, dra.ClaimResult]:
        p = self._plugin(driver)
        r = dra.unprepare(p.endpoint, claims, p.service, self._t(timeout))
        self.log.append(f"NodeUnprepareResources {[c[1] for c in claims]}: {r.status}")
        if not r.ok or r.value is None:
            raise StandInError(f"NodeUnprepareResources on {p.endpoint}: {r.status}: {r.detail}")
        for _, uid, _ in claims:
            self.claims.pop(uid, None)
        self.write_checkpoint()
        return {c.uid: c for c in r.value}

    def _plugin(self, driver: str) -> Registered:
        if driver not in self.plugins:
            raise StandInError(f"driver {driver} is not registered")
        return self.plugins[driver]

    def write_checkpoint(self) -> Path:
        """The kubelet's `dra_manager_state` (checkpoint.dra.kubelet.k8s.io/v1, kubelet 1.31+ layout)."""
        entries = [{"ClaimUID": e.uid, "ClaimName": e.name, "Namespace": e.namespace,
                    "PodUIDs": {u: {} for u in sorted(e.pod_uids)},
                    "DriverState": {d: {"Devices": [{"PoolName": x.pool, "DeviceName": x.device,
                                                     "RequestNames": list(x.request_names),
                                                     "CDIDeviceIDs": list(x.cdi_device_ids)} for x in devs]}
                                    for d, devs in sorted(e.devices.items())}}
                   for e in self.claims.values()]
        data = json.dumps({"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
                           "Entries": entries}, separators=(",", ":"))
        path = self.root / CHECKPOINT
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"Data": data, "Checksum": 0}))
        tmp.replace(path)
        return path

    # -- the runtime's side ----------------------------------------------------------------------
    def cdi_device_nodes(self, ids: Iterable[str], host_dev: str = "/") -> list[dict[str, Any]]:
        """The device nodes the runtime creates for these CDI device IDs (path, type, major, minor, from)."""
        specs = load_cdi_specs(self.cdi_dirs)
        out: dict[str, dict[str, Any]] = {}
        for cid in ids:
            kind, _, name = cid.partition("=")
            spec = specs.get(kind)
            dev = next((d for d in (spec or {}).get("devices") or [] if d.get("name") == name), None)
            if spec is None or dev is None:
                raise StandInError(f"CDI device {cid} is in no spec under {', '.join(self.cdi_dirs)}: the runtime "
                                   "refuses to create the container")
            for edits in (spec.get("containerEdits") or {}, dev.get("containerEdits") or {}):
                for n in edits.get("deviceNodes") or []:
                    node = _fill(n, host_dev)
                    node["from"] = f"{spec['_file']} ({cid})"
                    out[node["path"]] = node
        return list(out.values())


def load_cdi_specs(dirs: Iterable[str]) -> dict[str, dict[str, Any]]:
    """kind -> spec (JSON or YAML files); a later directory overrides an earlier one, as in CDI's cache."""
    import yaml

    specs: dict[str, dict[str, Any]] = {}
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            if not n.endswith((".json", ".yaml", ".yml")):
                continue
            try:
                doc = yaml.safe_load(Path(d, n).read_text())
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(doc, dict) and isinstance(doc.get("kind"), str):
                doc["_file"] = str(Path(d, n))
                specs.setdefault(doc["kind"], {"devices": [], "containerEdits": {}, "_file": doc["_file"]})
                merged = specs[doc["kind"]]
                merged["devices"] = [x for x in merged["devices"]
                                     if x.get("name") not in {y.get("name") for y in doc.get("devices") or []}] \
                    + list(doc.get("devices") or [])
                if doc.get("containerEdits"):
                    merged["containerEdits"] = doc["containerEdits"]
                merged["_file"] = doc["_file"]
    return specs


def _fill(n: dict[str, Any], host_dev: str) -> dict[str, Any]:
    """A deviceNode with type/major/minor, filled from the host's node when the spec leaves them out."""
    path = str(n.get("path", ""))
    node = {"path": path, "type": n.get("type") or "", "major": n.get("major"), "minor": n.get("minor")}
    if node["major"] is None or node["minor"] is None or not node["type"]:
        # hostPath names the node on the host as it is; without it, `path` is looked up in the host's /dev
        host = str(n["hostPath"]) if n.get("hostPath") else os.path.join(host_dev, path.lstrip("/"))
        try:
            st = os.stat(host)
        except OSError as exc:
            raise StandInError(f"CDI deviceNode {path}: host node {host}: {exc.strerror}") from None
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise StandInError(f"CDI deviceNode {path}: {host} is not a device node")
        node["type"] = node["type"] or ("c" if stat.S_ISCHR(st.st_mode) else "b")
        node["major"] = os.major(st.st_rdev) if node["major"] is None else node["major"]
        node["minor"] = os.minor(st.st_rdev) if node["minor"] is None else node["minor"]
    return node


def device_rules(nodes: Iterable[dict[str, Any]]) -> list[str]:
    """The cgroup device rules runc adds for the container's device nodes (`c 195:0 rwm` …)."""
    return [f"{n['type']} {n['major']}:{n['minor']} rwm" for n in nodes]
