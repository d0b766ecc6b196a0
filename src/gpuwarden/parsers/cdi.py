"""A CDI spec (Container Device Interface, cncf-tags/container-device-interface SPEC.md), parsed.

A spec is JSON or YAML with `kind: <vendor>/<class>`, spec-wide `containerEdits` and `devices[]`,
each with a `name` and its own `containerEdits` (`deviceNodes[]` with path and optional
type/major/minor, `mounts[]` with hostPath, `env[]`, `hooks[]`). A device's qualified name is
`<vendor>/<class>=<name>`; the runtime applies the spec-wide edits and the device's own.

The YAML parser is imported only for a spec that is not JSON: a node without YAML specs (and a
check that reads none) never loads it. Garbage gives None or a spec with fewer entries, never an
exception. A device node no kernel could have (a major beyond 12 bits, a minor beyond 20, a
number that is no integer, `/dev/nvidia99999999`: parsers.plausible) makes the whole spec
`impossible`: the reader takes nothing from it, as from a torn file, rather than a spec short of
that node or with a stale one.
"""

from __future__ import annotations

from typing import Callable

import json

from msgspec import Struct, field

from gpuwarden.parsers import lazyre, plausible

#: a transient (per-request) spec file name: `<vendor>-<class>_<transientID>.{yaml,json}`
#: (GenerateTransientSpecName: the vendor and class joined by "-", "/" in the ID made "_")
_TRANSIENT = lazyre.compile(r"^(?P<vendor>[A-Za-z0-9][A-Za-z0-9.-]*)-(?P<cls>[A-Za-z0-9][A-Za-z0-9_.-]*?)_(?P<id>[^/]+)\.(?:yaml|json)$")


class DeviceNode(Struct, frozen=True):
    """A device node a CDI spec injects."""
    path: str
    type: str = ""  # "c" | "b" | "" (the runtime stats the host node)
    major: int | None = None
    minor: int | None = None
    host_path: str = ""


class Edits(Struct):
    """A CDI spec's container edits: device nodes, mounts and environment."""
    device_nodes: list[DeviceNode] = field(default_factory=list)
    mount_hosts: list[str] = field(default_factory=list)  # hostPath of each mount
    env: list[str] = field(default_factory=list)

    def paths(self) -> set[str]:
        return {d.path for d in self.device_nodes}


class CdiSpec(Struct):
    """One CDI spec file, parsed."""
    kind: str  # "<vendor>/<class>"
    version: str
    common: Edits
    devices: dict[str, Edits]  # device name -> its own edits
    problems: list[str] = field(default_factory=list)  # entries skipped, and why
    #: values no node can have (the first few): the spec is damage, not a fact (see the module doc)
    impossible: list[str] = field(default_factory=list)

    @property
    def vendor(self) -> str:
        return self.kind.split("/", 1)[0]

    def qualified(self, name: str) -> str:
        return f"{self.kind}={name}"

    def edits_for(self, name: str) -> list[Edits]:
        """What a container that gets device `name` receives: the spec-wide edits, then the device's."""
        own = self.devices.get(name)
        return [self.common] + ([own] if own is not None else [])


def transient_id(filename: str, vendor_class: str) -> str | None:
    """The transient ID of a spec file named for `vendor_class` ("k8s.gpu.nvidia.com-claim"), or None."""
    m = _TRANSIENT.match(filename)
    if not m or f"{m['vendor']}-{m['cls']}" != vendor_class:
        return None
    return m["id"]


MAX_IMPOSSIBLE = 3


def _edits(raw: object, problems: list[str], where: str, impossible: list[str]) -> Edits:
    out = Edits()
    if raw is None:
        return out
    if not isinstance(raw, dict):
        problems.append(f"{where}: containerEdits is not a mapping")
        return out
    for dn in raw.get("deviceNodes") or []:
        if not isinstance(dn, dict) or not isinstance(dn.get("path"), str):
            problems.append(f"{where}: a deviceNodes entry without a path")
            continue
        t, host = dn.get("type"), dn.get("hostPath")
        major, minor = dn.get("major"), dn.get("minor")
        why = plausible.device_problem(dn["path"], major, minor) or (
            plausible.device_problem(host) if isinstance(host, str) and host else None)
        if why:
            if len(impossible) < MAX_IMPOSSIBLE:
                impossible.append(f"{where[:100]}: {why}")
            continue
        out.device_nodes.append(DeviceNode(dn["path"], t if t in ("c", "b", "u", "p") else "", major, minor,
                                           host if isinstance(host, str) else ""))
    for m in raw.get("mounts") or []:
        if isinstance(m, dict) and isinstance(m.get("hostPath"), str):
            out.mount_hosts.append(m["hostPath"])
    out.env = [e for e in raw.get("env") or [] if isinstance(e, str)]
    return out


def load(text: str, yaml_load: Callable[[str], object] | None = None) -> object:
    """The document of a JSON or YAML spec, or None when it is neither. `yaml_load`: the caller's
    bounded YAML loader (a node's specs are anyone's input: gpuwarden.safeyaml via the facts);
    without one, PyYAML's safe loader."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            return None
    if yaml_load is not None:
        return yaml_load(text)
    import yaml  # only for a YAML spec (nvidia-ctk and the DRA driver write YAML)

    try:
        # libyaml's parser when PyYAML has it: the same safe constructor, several times faster (a node
        # holds one spec per prepared claim)
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except yaml.YAMLError:
        return None
    except (ValueError, TypeError, RecursionError):  # hostile YAML (deep nesting, bad scalars)
        return None


def parse(text: str, yaml_load: Callable[[str], object] | None = None) -> CdiSpec | None:
    """The spec in `text`, or None when it is not a CDI spec (no mapping, no `kind`)."""
    try:
        doc = load(text, yaml_load)
    except RecursionError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str) or "/" not in doc["kind"]:
        return None
    problems: list[str] = []
    impossible: list[str] = []
    spec = CdiSpec(doc["kind"], str(doc.get("cdiVersion", "")),
                   _edits(doc.get("containerEdits"), problems, "spec", impossible), {}, problems, impossible)
    devices = doc.get("devices")
    for d in devices if isinstance(devices, list) else []:
        if not isinstance(d, dict) or not isinstance(d.get("name"), (str, int)):
            problems.append("a devices entry without a name")
            continue
        name = str(d["name"])
        spec.devices[name] = _edits(d.get("containerEdits"), problems, f"device {name}", impossible)
    return spec
