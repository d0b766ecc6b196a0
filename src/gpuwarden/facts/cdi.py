"""The `cdi` fact: the node's CDI specs, parsed, and which spec defines each device the runtime sees.

CDI (cncf-tags/container-device-interface, pkg/cdi/doc.go and cache.go) scans `/etc/cdi` then
`/var/run/cdi`; a spec from a later directory has the higher priority, and when two specs define
the same qualified device (`vendor/class=name`) the higher priority wins; two of the same
priority cancel each other (the device becomes unresolvable). Only `.json` and `.yaml` files are
specs. The toolkit writes the node spec (`nvidia.com/gpu`, `/var/run/cdi/nvidia.yaml`); the NVIDIA
DRA driver writes one transient spec per prepared claim, `k8s.gpu.nvidia.com-claim_<claimUID>.yaml`
(kind `k8s.gpu.nvidia.com/claim`, devices `<claimUID>-<device>`), under its `--cdi-root`.

Specs are parsed only when the section is asked for, and YAML only for a spec that is YAML. A spec
with a device node no kernel could have is read as no spec, and says so as unreadable (malformed).
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import cdi
from gpuwarden.root import Missing, StatInfo

#: scan order = priority order (the later wins)
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_MAX = 4 << 20
#: the NVIDIA DRA driver's claim specs: vendor "k8s.gpu.nvidia.com", class "claim"
DRA_CLAIM_KIND = "k8s.gpu.nvidia.com/claim"


class SpecFile(Struct):
    """A CDI spec file of the node and what it parsed to."""
    path: str
    priority: int  # index of its directory in CDI_DIRS
    spec: cdi.CdiSpec | None  # None: not a CDI spec (the reason in `problem`)
    problem: str = ""
    claim_uid: str = ""  # for a DRA claim spec (also one read as impossible): the claim it was written for
    mtime: float | None = None  # when it was written (a node spec older than /dev/nvidia-uvm lacks it)


class CdiFacts(Struct):
    """The node's CDI specs, the devices they name and their conflicts."""
    files: list[SpecFile]
    #: qualified device name -> the spec file whose definition the runtime uses
    devices: dict[str, SpecFile] = field(default_factory=dict)
    #: qualified names defined twice at the same priority: unresolvable
    conflicts: dict[str, list[str]] = field(default_factory=dict)

    def claim_specs(self) -> dict[str, SpecFile]:
        """claimUID -> its spec file (the highest priority one when several)."""
        out: dict[str, SpecFile] = {}
        for f in self.files:
            if f.claim_uid and f.spec is not None and (f.claim_uid not in out or f.priority >= out[f.claim_uid].priority):
                out[f.claim_uid] = f
        return out

    def damaged_claim_specs(self) -> dict[str, SpecFile]:
        """claimUID -> its spec file read as impossible (no readable spec of that claim beside it)."""
        ok = self.claim_specs()
        return {f.claim_uid: f for f in self.files if f.claim_uid and f.spec is None and f.claim_uid not in ok}

    def node_specs(self) -> list[SpecFile]:
        """The specs that are not a DRA claim's (the toolkit's node spec and any other vendor's)."""
        return [f for f in self.files if not f.claim_uid]

    def resolve(self, qualified: str) -> tuple[SpecFile, str] | None:
        """(spec file, device name) of a qualified CDI device as the runtime resolves it, or None."""
        f = self.devices.get(qualified)
        if f is None or f.spec is None:
            return None
        return f, qualified.split("=", 1)[1]



def bounded_yaml(text: str) -> object:
    """A node's YAML spec through the bounded loader (aliases, nesting, size: gpuwarden.safeyaml),
    None when it is refused: a spec under the root is anyone's input (docs/security.md)."""
    from gpuwarden import safeyaml

    try:
        return safeyaml.load(text)
    except safeyaml.YamlError:
        return None

def is_claim_spec_name(path: str) -> bool:
    """Whether a path is named as a DRA claim's transient spec (without parsing it)."""
    return cdi.transient_id(path.rsplit("/", 1)[-1], DRA_CLAIM_KIND.replace("/", "-")) is not None


@fact("cdi")
def collect_cdi(facts: NodeFacts) -> CdiFacts:
    files: list[SpecFile] = []
    seen_dir = False
    for prio, d in enumerate(CDI_DIRS):
        names = facts.root.listdir(d)
        if isinstance(names, Missing):
            if names.kind != "missing":
                facts.gap(names)
            continue
        seen_dir = True
        for n in sorted(names):
            if not n.endswith((".json", ".yaml")):
                continue  # CDI reads no other file
            path = f"{d}/{n}"
            text = facts.read_text(path, SPEC_MAX)
            if text is None:
                continue
            spec = cdi.parse(text, bounded_yaml)
            problem = "" if spec is not None else "not a CDI spec (unparsable or no kind)"
            uid = cdi.transient_id(n, DRA_CLAIM_KIND.replace("/", "-")) or ""
            uid = uid if spec is not None and spec.kind == DRA_CLAIM_KIND else ""
            if spec is not None and spec.impossible:  # damage, not a spec: nothing is concluded from it
                problem, spec = "impossible values: " + "; ".join(spec.impossible), None
                facts.gap(path, f"unreadable (malformed): {problem}")
            st = facts.root.stat(path)
            files.append(SpecFile(path, prio, spec, problem, uid, st.mtime if isinstance(st, StatInfo) else None))
    if not seen_dir:
        raise FactUnavailable(f"neither {' nor '.join(CDI_DIRS)} exists")
    out = CdiFacts(files)
    for f in files:
        if f.spec is None:
            continue
        for name in f.spec.devices:
            q = f.spec.qualified(name)
            old = out.devices.get(q)
            if old is None or f.priority > old.priority:
                out.devices[q] = f  # (a conflict seen before stays one: CDI's cache drops it all the same)
            elif f.priority == old.priority:
                out.conflicts.setdefault(q, [old.path]).append(f.path)
    for q in out.conflicts:
        out.devices.pop(q, None)
    return out
