"""The `dra_probe` fact: what each DRA kubelet plugin on the node answered to the kubelet's calls.

Live: every `<kubelet root>/plugins_registry/<driver>-reg.sock` (and every
`plugins/<driver>/dra.sock` without one) is asked GetInfo and the empty NodePrepareResources
(probes/dra.py), each call with the probe deadline, all drivers at once, in a killable child (a fresh
interpreter). Bundles carry the result recorded at collection in `/.gpuwarden/dra-probe.json`, so a
hang seen then stays evidence offline. Sockets are found through the root, opened beneath it before
the child starts and connected to through those fds (probes.dra.run): never outside the node's root.

A socket that refuses connections is a dead plugin only on the node itself: a copied tree's socket
files never had a listener. So a refusal is judged here (refusal_verdict): "gone" only when the root is
the running system's own (HostRoot.node_identity) and its process table shows no process of the
plugin; "running" when it shows one; else "not sure", which is no evidence at all (docs/dra.md).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from msgspec import Struct, field
from msgspec.structs import asdict, replace

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import plausible
from gpuwarden.root import Missing, StatInfo

if TYPE_CHECKING:
    from gpuwarden.facts.processes import ProcessTable

PROBE_FILE = "/.gpuwarden/dra-probe.json"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
REG_SUFFIX = "-reg.sock"
MAX_DRIVERS = 32  # a node runs a handful; more is garbage (probes.dra.MAX_DRIVERS asks that many at once)
#: the kubelet plugins of drivers whose binary does not name its driver in its argv
PLUGIN_BINARIES = {"gpu.nvidia.com": ("gpu-kubelet-plugin",),
                   "compute-domain.nvidia.com": ("compute-domain-kubelet-plugin",)}
#: what a refused connection says about the plugin (DriverProbe.refused)
GONE, RUNNING, NOT_SURE = "gone", "running", "not sure"


class DraCall(Struct, frozen=True):
    """One gRPC call to a DRA kubelet plugin and its answer."""
    rpc: str  # GetInfo | NodePrepareResources
    socket: str  # the node path called
    status: str  # ok | timeout | unavailable | unimplemented | error
    elapsed_s: float
    detail: str
    timeout_s: float
    service: str = ""


class DriverProbe(Struct, frozen=True):
    """What probing one DRA driver's sockets found."""
    driver: str
    registration: str  # node path of its -reg.sock, "" if none
    service: str  # node path of its dra.sock, "" if none
    calls: tuple[DraCall, ...]
    info: dict[str, Any] | None = None  # GetInfo's answer
    #: for a socket that refused connections: GONE (the node itself, no process of the plugin), RUNNING
    #: (its process runs) or NOT_SURE (a copied tree, a bundle that did not record it); "" no refusal
    refused: str = ""
    refused_why: str = ""  # the evidence for `refused`, or why it could not be told

    def call(self, rpc: str) -> DraCall | None:
        return next((c for c in self.calls if c.rpc == rpc), None)


class DraProbe(Struct):
    """The DRA probe's outcome for every driver."""
    status: str  # the probe child's: ok | timeout | error
    detail: str
    elapsed_s: float
    drivers: list[DriverProbe] = field(default_factory=list)
    recorded: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "elapsed_s": round(self.elapsed_s, 3),
                "value": [{"driver": d.driver, "registration": d.registration, "service": d.service, "info": d.info,
                           "calls": [asdict(c) for c in d.calls],
                           **({"refused": {"verdict": d.refused, "why": d.refused_why}} if d.refused else {})}
                          for d in self.drivers]}


def _kubelet_root(facts: NodeFacts) -> str:
    kub = facts.maybe("kubelet")
    return kub.root_dir if kub is not None else DEFAULT_KUBELET_ROOT


def _is_socket(facts: NodeFacts, path: str) -> bool:
    st = facts.root.stat(path, follow=False)
    return isinstance(st, StatInfo) and st.kind == "other"


def targets(facts: NodeFacts) -> list[dict[str, str]]:
    """The DRA drivers to ask: their sockets' node paths (probes.dra.run opens them beneath the root)."""
    kr = _kubelet_root(facts)
    found: dict[str, dict[str, str]] = {}
    names = facts.root.listdir(f"{kr}/plugins_registry")
    for n in sorted(names) if not isinstance(names, Missing) else []:
        driver = n[:-len(REG_SUFFIX)] if n.endswith(REG_SUFFIX) else ""
        if driver and "." in driver and _is_socket(facts, f"{kr}/plugins_registry/{n}"):  # DRA drivers are DNS names
            found[driver] = {"driver": driver, "registration": f"{kr}/plugins_registry/{n}"}
    dirs = facts.root.listdir(f"{kr}/plugins")
    for d in sorted(dirs) if not isinstance(dirs, Missing) else []:
        if "." in d and _is_socket(facts, f"{kr}/plugins/{d}/dra.sock"):
            found.setdefault(d, {"driver": d})["service"] = f"{kr}/plugins/{d}/dra.sock"
    return list(found.values())[:MAX_DRIVERS]


def _call(doc: Any) -> DraCall | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("rpc"), str) or not isinstance(doc.get("status"), str):
        return None

    def num(k: str) -> float:
        v = doc.get(k)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

    return DraCall(doc["rpc"][:64], str(doc.get("socket", ""))[:512], doc["status"][:32], num("elapsed_s"),
                   str(doc.get("detail", ""))[:1024], num("timeout_s"), str(doc.get("service", ""))[:128])


def from_json(doc: Any, recorded: bool) -> DraProbe:
    """A DraProbe from the child's result or a bundle's record; malformed entries are dropped."""
    if not isinstance(doc, dict):
        raise FactUnavailable(f"{PROBE_FILE} is not a JSON object")
    why = plausible.json_problem(doc)
    if why:
        raise FactUnavailable(f"{PROBE_FILE} unreadable: impossible value ({why})")
    drivers = []
    value = doc.get("value")
    for d in value[:MAX_DRIVERS] if isinstance(value, list) else []:
        if not isinstance(d, dict) or not isinstance(d.get("driver"), str):
            continue
        calls = tuple(c for c in map(_call, d.get("calls") or [] if isinstance(d.get("calls"), list) else []) if c)
        info = d.get("info") if isinstance(d.get("info"), dict) else None
        refused = d.get("refused") if isinstance(d.get("refused"), dict) else {}
        verdict, why = refused.get("verdict"), refused.get("why")
        if any(c.status == "unavailable" for c in calls):
            if verdict not in (GONE, RUNNING, NOT_SURE) or not isinstance(why, str):
                verdict, why = NOT_SURE, ("the probe recorded no verdict on the node (its process table): a socket that "
                                          "refuses connections alone is no evidence that the plugin died")
        else:
            verdict, why = "", ""
        drivers.append(DriverProbe(d["driver"][:253], str(d.get("registration") or "")[:512],
                                   str(d.get("service") or "")[:512], calls, info, verdict, why[:1024]))
    elapsed = doc.get("elapsed_s")
    return DraProbe(str(doc.get("status", "error"))[:32], str(doc.get("detail", ""))[:1024],
                    float(elapsed) if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) else 0.0,
                    drivers, recorded)


@fact("dra_probe")
def collect_dra_probe(facts: NodeFacts) -> DraProbe:
    if not facts.root.live:
        text = facts.read_text(PROBE_FILE)
        if text is None:
            if not targets(facts):  # no DRA socket on the node either: nothing was there to ask
                return DraProbe("ok", "no DRA plugin socket", 0.0)
            raise FactUnavailable("no DRA plugin probe recorded in this bundle")
        try:
            doc = json.loads(text)
        except ValueError:
            raise FactUnavailable(f"{PROBE_FILE} is not JSON") from None
        return _unsure_noted(facts, from_json(doc, recorded=True))
    if not facts.settings.probes:
        raise FactUnavailable("live probes disabled (--no-probes)")
    ts = targets(facts)
    if not ts:  # a device-plugin node: nothing to ask, nothing hung
        return DraProbe("ok", f"no DRA plugin socket under {_kubelet_root(facts)}/plugins_registry or plugins/*/", 0.0)
    from gpuwarden.probes import dra

    r = dra.run(facts.root, ts, facts.settings.probe_timeout_s)
    assert r is not None  # targets were found
    out = from_json({"status": r.status, "detail": r.detail, "elapsed_s": r.elapsed_s, "value": r.value or []},
                    recorded=False)
    # the child killed at its deadline: the drivers it had not answered for are unaccounted for
    done = {d.driver for d in out.drivers}
    out.drivers += [DriverProbe(t["driver"], t.get("registration", ""), t.get("service", ""), ())
                    for t in ts if t["driver"] not in done]
    if any(d.refused for d in out.drivers):
        why_not = facts.root.node_identity() if hasattr(facts.root, "node_identity") else "not a live root"
        procs = facts.maybe("processes") if not why_not else None
        verdicts = {d.driver: refusal_verdict(d.driver, why_not, procs, os.getpid()) for d in out.drivers if d.refused}
        out.drivers = [replace(d, refused=verdicts[d.driver][0], refused_why=verdicts[d.driver][1])
                       if d.driver in verdicts else d for d in out.drivers]
    return _unsure_noted(facts, out)


def _unsure_noted(facts: NodeFacts, out: DraProbe) -> DraProbe:
    """A gap for each driver whose refused socket is no evidence here: "not checked", never "fine"."""
    for d in out.drivers:
        if d.refused == NOT_SURE:
            facts.gap(f"probe:dra {d.driver}", f"its socket refuses connections; not evidence that the plugin died: "
                                               f"{d.refused_why}")
    return out


def plugin_processes(driver: str, procs: ProcessTable, own_pid: int = 0) -> list[int]:
    """The pids of the processes that look like `driver`'s kubelet plugin: its known binary, or an
    argument naming the driver (`--driver-name=…`, a path under plugins/<driver>/); never `own_pid`."""
    names = PLUGIN_BINARIES.get(driver, ())
    return sorted(p.pid for p in procs.procs.values()
                  if p.pid != own_pid and (p.exe_name in names or any(driver in a for a in p.argv)))


def refusal_verdict(driver: str, why_not_node: str, procs: ProcessTable | None,
                    own_pid: int = 0) -> tuple[str, str]:
    """What a refused connection to `driver`'s socket says (pure): (GONE | RUNNING | NOT_SURE, why).

    On a copied tree a socket file never had a listener, so the refusal is evidence only where the root
    is the running system's own (`why_not_node` "") and its process table could be read."""
    if why_not_node:
        return NOT_SURE, f"this root is not the running node ({why_not_node})"
    if procs is None or not procs.procs:
        return NOT_SURE, "the node's process table could not be read"
    pids = plugin_processes(driver, procs, own_pid)
    looked = f"argv naming {driver}" + (f" or {', '.join(PLUGIN_BINARIES[driver])}" if driver in PLUGIN_BINARIES else "")
    if pids:
        return RUNNING, f"/proc: process(es) of the plugin still run ({looked}): pid " + ", ".join(map(str, pids[:8]))
    return GONE, f"/proc: no process of the plugin among {len(procs.procs)} ({looked})"
