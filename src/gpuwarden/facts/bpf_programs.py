"""Unified-hierarchy device policy: the BPF programs in force for each container, and their verdicts.

They apply on a pure cgroup v2 host and on a hybrid one (v1 controllers plus cgroup2 mounted
beside them), where they are checked before the v1 devices list. Live, the programs are read
through the bpf(2) syscall in a killable child (the syscall needs CAP_SYS_ADMIN and must never
block the check), and only when live probes are on: under `--no-probes` bpf(2) is never called
and the programs are reported as not evaluated. A bundle carries the translated instructions in
`/.gpuwarden/bpf-programs.json`, so the same evaluation runs offline.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from gpuwarden.facts.device_verdict import AccessVerdict
from gpuwarden.facts.driver import DeviceNode
from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact

PROGRAMS_FILE = "/.gpuwarden/bpf-programs.json"


def read_programs(dirs: dict[str, str]) -> dict[str, Any]:
    """Runs in the child: {container id: [program dict] | {"error": ...}}."""
    from gpuwarden.bpf.syscall import BpfError, read_cgroup_device_programs

    out: dict[str, Any] = {}
    for cid, path in dirs.items():
        try:
            progs = read_cgroup_device_programs(path, effective=True)
            out[cid] = {"cgroup": path, "programs": [
                {"id": p.id, "name": p.name, "tag": p.tag, "xlated": p.xlated.hex()} for p in progs]}
        except (BpfError, OSError) as exc:
            out[cid] = {"cgroup": path, "error": f"{type(exc).__name__}: {exc}"}
    return out


NO_PROBES = "not evaluated: live probes are off (--no-probes), so bpf(2) was not called"


def container_dirs(facts: NodeFacts) -> dict[str, str]:
    """{container id: its unified-hierarchy directory on the host} (pure v2 and hybrid hosts)."""
    ctrs = facts.get("containers")
    out = {}
    for _, c in ctrs.containers():
        d = ctrs.layout.dir("unified", c.unified_cgroup) if c.unified_cgroup is not None else None
        if d:
            out[c.id] = facts.root.host_path(d) or d
    return out


@fact("bpf_programs")
def collect_bpf_programs(facts: NodeFacts) -> dict[str, Any]:
    if not facts.root.live:
        text = facts.read_text(PROGRAMS_FILE)
        if text is None:
            raise FactUnavailable("no unified-hierarchy (cgroup2) device programs recorded in this bundle")
        try:
            return json.loads(text)
        except ValueError:
            raise FactUnavailable(f"{PROGRAMS_FILE} is not JSON") from None
    if not facts.settings.probes:
        raise FactUnavailable(NO_PROBES)
    dirs = container_dirs(facts)
    if not dirs:
        raise FactUnavailable("no container has a cgroup in a unified (cgroup2) hierarchy")
    from gpuwarden.probes.bounded import run_func

    out = run_func(read_programs, dirs, timeout=facts.settings.probe_timeout_s)
    if not out.ok:
        raise FactUnavailable(f"reading cgroup v2 device programs failed: {out.detail}")
    return out.value


@functools.lru_cache(maxsize=4096)
def _evaluate(codes: tuple[bytes, ...], major: int, minor: int) -> Any:
    """evaluate_all for an rw open of a char device: a pure function of the programs' bytes, and the
    containers of a node mostly run the same few programs (each a Python-interpreted BPF run)."""
    from gpuwarden.bpf.evaluate import evaluate_all

    return evaluate_all(list(codes), "c", major, minor, "rw")


def unevaluated(needed: list[DeviceNode], reason: str, source: str = "bpf") -> dict[str, AccessVerdict]:
    """Undecided verdicts for programs that were not read (and why): never a silent allow."""
    return {n.path: AccessVerdict(n, None, "bpf", f"unified-hierarchy device programs {reason}", source) for n in needed}


def verdicts_for(entry: Any, needed: list[DeviceNode]) -> dict[str, AccessVerdict]:
    """Evaluate every needed node against the container's programs (all must allow)."""
    if not isinstance(entry, dict):
        return unevaluated(needed, "not recorded for this container")
    cgroup = entry.get("cgroup", "?")
    if "error" in entry:
        return {n.path: AccessVerdict(n, None, "bpf", f"programs unreadable: {entry['error']}", cgroup) for n in needed}
    progs = entry.get("programs") or []
    codes = tuple(bytes.fromhex(p.get("xlated", "")) for p in progs)
    ids = ", ".join(f"{p.get('id')}:{p.get('name') or '?'}" for p in progs) or "none"
    out = {}
    for n in needed:
        v = _evaluate(codes, n.major, n.minor)
        out[n.path] = AccessVerdict(n, v.allowed, "bpf", f"{v.reason} [programs {ids}]", f"bpf: {cgroup}")
    return out
