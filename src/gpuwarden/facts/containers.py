"""Pods and containers on the node, found from the cgroup tree and the runtime's state.

Kubelet names pod cgroups after the pod UID (cgroupfs: `kubepods/<qos>/pod<uid>`,
systemd: `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice`) and
container cgroups after the container id (`<id>`, `cri-containerd-<id>.scope`,
`docker-<id>.scope`, `crio-<id>.scope`). Names come from the runtime's own state
(containerd's OCI config.json annotations, docker's config.v2.json) or from
`/var/log/pods/<ns>_<name>_<uid>/`.
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.parsers.devices_list import DeviceRule


class Container(Struct):
    """A container found under the kubepods cgroups, with its pids."""
    id: str
    name: str  # "" when unknown; "POD" for the sandbox
    pod_uid: str
    cgroup: str  # relative to the hierarchy root, e.g. "kubepods/burstable/pod<uid>/<id>"
    runtime: str = ""  # "containerd" | "docker" | "crio" | ""
    sandbox: bool = False
    pids: list[int] = field(default_factory=list)
    #: cgroup v1 devices.list, parsed; None on v2 or when unreadable
    device_rules: list[DeviceRule] | None = None
    device_rules_source: str = ""
    #: lines of devices.list that were not rules (the kernel never writes one: a corrupt capture)
    device_rules_bad: int = 0
    #: OCI spec facts, when the runtime state was readable
    spec_devices: list[dict] | None = None  # linux.devices[] (path, type, major, minor)
    spec_device_rules: list[DeviceRule] | None = None  # linux.resources.devices[]
    env: dict[str, str] = field(default_factory=dict)  # allow-listed NVIDIA_* env only
    annotations: dict[str, str] = field(default_factory=dict)
    spec_source: str = ""
    #: container's own view of /dev (from /proc/<pid>/root/dev), path -> (major, minor)
    dev_view: dict[str, tuple[int, int]] | None = None
    started_at: float | None = None  # process start time (epoch s) of its first pid
    #: its cgroup in the unified hierarchy (relative), where BPF device programs apply: the same as
    #: `cgroup` on pure v2; on a hybrid host read from /proc/<pid>/cgroup ("0::") or found by path
    unified_cgroup: str | None = None
    #: on a hybrid host with no unified_cgroup: why it is unknown ("" when the kernel shows none)
    unified_unknown: str = ""

    @property
    def ref(self) -> str:
        return f"{self.name or self.id[:12]}"


class Pod(Struct):
    """A pod found under the kubepods cgroups, with its containers."""
    uid: str
    name: str
    namespace: str
    qos: str  # "guaranteed" | "burstable" | "besteffort"
    cgroup: str
    containers: list[Container] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else f"pod {self.uid}"


class CgroupLayout(Struct):
    """Where the hierarchies are: v1 per-controller mounts, or one v2 tree."""

    version: int  # 1 (legacy or hybrid) | 2 (unified)
    driver: str  # "cgroupfs" | "systemd"
    v1_mounts: dict[str, str] = field(default_factory=dict)  # controller -> mount point
    v2_mount: str | None = None

    def dir(self, controller: str, rel: str) -> str | None:
        """Absolute node path of a cgroup for a controller ("memory", "devices", "unified")."""
        rel = rel.strip("/")
        if self.version == 2 or controller == "unified":
            return f"{self.v2_mount}/{rel}" if self.v2_mount else None
        base = self.v1_mounts.get(controller)
        return f"{base}/{rel}" if base else None

    @property
    def hybrid(self) -> bool:
        """v1 controllers with cgroup2 mounted beside them: both device policies apply."""
        return self.version == 1 and self.v2_mount is not None


class ContainerFacts(Struct):
    """Every pod and container of the node's cgroup tree, and the tree's layout."""
    layout: CgroupLayout
    pods: list[Pod]
    kubepods: str  # the kubepods root, relative ("kubepods" or "kubepods.slice")

    def containers(self) -> list[tuple[Pod, Container]]:
        return [(p, c) for p in self.pods for c in p.containers if not c.sandbox]

    def pod_by_uid(self, uid: str) -> Pod | None:
        for p in self.pods:
            if p.uid == uid:
                return p
        return None

    def find(self, pod_uid: str, container_name: str) -> Container | None:
        pod = self.pod_by_uid(pod_uid)
        if pod:
            for c in pod.containers:
                if c.name == container_name:
                    return c
        return None


# --- collection -------------------------------------------------------------

import json as _json
import re as _re

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import cri_log, devices_list, plausible, proc_pid
from gpuwarden.root import Missing, StatInfo

CGROUP_ROOT = "/sys/fs/cgroup"
_POD_CGROUPFS = _re.compile(r"^pod([0-9a-fA-F-]{36})$")
_POD_SYSTEMD = _re.compile(r"^kubepods(?:-(?:burstable|besteffort))?-pod([0-9a-fA-F_]{36})\.slice$")
_CTR = _re.compile(r"^(?:(cri-containerd|docker|crio|cri-o)-)?([0-9a-f]{64})(?:\.scope)?$")
_LOG_LINK = _re.compile(r"^(?P<pod>[^_]+)_(?P<ns>[^_]+)_(?P<ctr>.+)-(?P<id>[0-9a-f]{64})\.log$")
#: env of a container worth keeping: device selection only, no values that may be secret
ENV_ALLOW = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_CONFIG_DEVICES",
             "NVIDIA_MIG_MONITOR_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_REQUIRE_CUDA",
             "CUDA_MPS_PIPE_DIRECTORY")  # an MPS client (the plugin's Allocate sets it): GPU-K8S-007/011
_RUNTIME_BY_PREFIX = {"cri-containerd": "containerd", "docker": "docker", "crio": "crio", "cri-o": "crio"}


def _layout(facts: NodeFacts) -> CgroupLayout:
    root = facts.root
    if not isinstance(root.stat(f"{CGROUP_ROOT}/cgroup.controllers"), Missing):
        return CgroupLayout(2, "", v2_mount=CGROUP_ROOT)
    names = root.listdir(CGROUP_ROOT)
    if isinstance(names, Missing):
        raise FactUnavailable(f"{CGROUP_ROOT} cannot be listed: {names.kind}")
    mounts: dict[str, str] = {}
    v2 = None
    for n in names:
        if n == "unified":
            v2 = f"{CGROUP_ROOT}/unified"
            continue
        for ctl in n.split(","):
            mounts.setdefault(ctl, f"{CGROUP_ROOT}/{n}")
    if not mounts:
        raise FactUnavailable(f"no cgroup hierarchy found under {CGROUP_ROOT}")
    return CgroupLayout(1, "", mounts, v2)


def _tree_base(layout: CgroupLayout) -> str | None:
    """The hierarchy whose kubepods tree we walk: devices on v1 (it holds the rules), else v2."""
    if layout.version == 2:
        return layout.v2_mount
    return layout.v1_mounts.get("devices") or layout.v1_mounts.get("memory") or layout.v1_mounts.get("pids")


def _children(facts: NodeFacts, path: str) -> list[str]:
    names = facts.root.listdir(path)
    if isinstance(names, Missing):
        return []
    out = []
    for n in names:
        if "." in n and not (n.endswith(".slice") or n.endswith(".scope")):
            continue  # control files such as devices.list, cgroup.procs
        st = facts.root.stat(f"{path}/{n}")
        if isinstance(st, StatInfo) and st.kind == "dir":
            out.append(n)
    return out


def _pod_dirs(facts: NodeFacts, base: str, kubepods: str) -> list[tuple[str, str, str]]:
    """(uid, qos, relative path) of every pod cgroup."""
    out = []
    top = f"{base}/{kubepods}"

    def scan(rel: str, qos: str) -> None:
        for n in _children(facts, f"{base}/{rel}"):
            m = _POD_CGROUPFS.match(n) or _POD_SYSTEMD.match(n)
            if m:
                out.append((m.group(1).replace("_", "-"), qos, f"{rel}/{n}"))
            elif qos == "guaranteed":
                q = n.replace("kubepods-", "").replace(".slice", "")
                if q in ("burstable", "besteffort"):
                    scan(f"{rel}/{n}", q)

    if not isinstance(facts.root.stat(top), Missing):
        scan(kubepods, "guaranteed")
    return out


#: (path, length, hash) of a spec's text -> what it sets on its container (`_spec_view`): a spec
#: does not change while its container lives, so a long-running agent parses each one once
_SPEC_VIEWS: dict[tuple[str, int, int], tuple] = {}
SPEC_VIEWS_MAX = 1024  # a node runs at most a few hundred containers; churn clears it now and then


def _spec(facts: NodeFacts, cid: str) -> tuple[tuple | None, str, str]:
    """What the container's OCI spec or runtime config sets on it (`_spec_view`), the path it came
    from, and the runtime."""
    candidates = (
        (f"/run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}/config.json", "containerd"),
        (f"/run/containerd/io.containerd.runtime.v1.linux/k8s.io/{cid}/config.json", "containerd"),
        (f"/run/containers/storage/overlay-containers/{cid}/userdata/config.json", "crio"),
        (f"/var/lib/docker/containers/{cid}/config.v2.json", "docker"),
    )
    for path, runtime in candidates:
        text = facts.root.read_text(path, 4 << 20)
        if isinstance(text, Missing):
            if text.kind != "missing":
                facts.gap(text)
            continue
        key = (path, len(text), hash(text))
        view = _SPEC_VIEWS.get(key)
        if view is not None:
            return view, path, runtime
        try:
            doc = _json.loads(text)
        except ValueError:
            facts.gap(path, "not JSON (garbage or truncated)")
            continue
        if not isinstance(doc, dict):
            continue
        view = _spec_view(doc, runtime)
        if len(_SPEC_VIEWS) >= SPEC_VIEWS_MAX:
            _SPEC_VIEWS.clear()
        _SPEC_VIEWS[key] = view
        return view, path, runtime
    return None, "", ""


#: OCI `linux.resources.devices` lists already turned into DeviceRules, by their repr: most
#: containers carry the same runtime defaults, so each distinct list is converted once
_SPEC_RULES: dict[str, tuple[devices_list.DeviceRule, ...]] = {}


def _spec_rule(r: dict) -> devices_list.DeviceRule:
    t = r.get("type") or "a"
    return devices_list.DeviceRule(
        t if t in ("a", "c", "b") else "a",
        r.get("major") if isinstance(r.get("major"), int) and r.get("major", -1) >= 0 else None,
        r.get("minor") if isinstance(r.get("minor"), int) and r.get("minor", -1) >= 0 else None,
        frozenset(str(r.get("access") or "rwm")),
        _json.dumps(r, sort_keys=True), bool(r.get("allow")),
    )


def _spec_rules(entries: list) -> list[devices_list.DeviceRule]:
    key = repr(entries)  # JSON values: repr tells 1, 1.0 and True apart
    got = _SPEC_RULES.get(key)
    if got is None:
        got = tuple(_spec_rule(r) for r in entries if isinstance(r, dict))
        if len(_SPEC_RULES) < 1024 and len(key) < 65536:
            _SPEC_RULES[key] = got
    return list(got)


def _spec_view(doc: dict, runtime: str) -> tuple:
    """What a spec sets on its container: (annotations, linux.devices, linux.resources.devices as
    DeviceRules, allow-listed env, problem). Read in that order; valid JSON of the wrong shape stops
    the reading where it breaks, keeping what came before, and names the problem."""
    annotations: dict[str, str] = {}
    devices = rules = None
    allowed: dict[str, str] = {}
    try:
        if runtime == "docker":
            cfg = doc.get("Config") or {}
            labels = cfg.get("Labels") or {}
            annotations = {k: str(v) for k, v in labels.items() if k.startswith("io.kubernetes.")}
            env = cfg.get("Env") or []
        else:
            annotations = {k: str(v) for k, v in (doc.get("annotations") or {}).items()
                           if k.startswith(("io.kubernetes.", "cdi.k8s.io/", "nvidia.com/"))}
            linux = doc.get("linux") or {}
            devices = tuple(d for d in (linux.get("devices") or []) if isinstance(d, dict))
            rules = tuple(_spec_rules((linux.get("resources") or {}).get("devices") or []))
            env = (doc.get("process") or {}).get("env") or []
        for item in env:
            k, sep, v = str(item).partition("=")
            if sep and k in ENV_ALLOW:
                allowed[k] = v
    except (AttributeError, TypeError, ValueError) as exc:
        # one bad spec must not hide every container
        return annotations, devices, rules, allowed, f"unexpected spec layout ({type(exc).__name__}: {exc})"
    return annotations, devices, rules, allowed, ""


def _apply_spec(c: Container, view: tuple) -> str:
    """Set a spec's view on its container; the problem of a malformed spec, or ""."""
    annotations, devices, rules, env, problem = view
    c.annotations = dict(annotations)
    c.spec_devices = list(devices) if devices is not None else None
    c.spec_device_rules = list(rules) if rules is not None else None
    c.env.update(env)
    if problem:
        return problem
    a = c.annotations
    c.name = (a.get("io.kubernetes.cri.container-name") or a.get("io.kubernetes.container.name") or c.name)
    ctype = a.get("io.kubernetes.cri.container-type") or a.get("io.kubernetes.docker.type") or ""
    if ctype in ("sandbox", "podsandbox") or c.name == "POD":
        c.sandbox = True
    return ""


def _dev_view(facts: NodeFacts, pid: int) -> dict[str, tuple[int, int]] | None:
    base = f"/proc/{pid}/root/dev"
    names = facts.root.listdir(base)
    if isinstance(names, Missing):
        return None
    out: dict[str, tuple[int, int]] = {}
    paths = [f"/dev/{n}" for n in names if n.startswith("nvidia") and n != "nvidia-caps"]
    if "nvidia-caps" in names:
        caps = facts.root.listdir(f"{base}/nvidia-caps")
        if not isinstance(caps, Missing):
            paths += [f"/dev/nvidia-caps/{n}" for n in caps]
    for p in paths:
        st = facts.root.stat(f"/proc/{pid}/root{p}")
        if isinstance(st, StatInfo) and st.major is not None and st.minor is not None:
            out[p] = (st.major, st.minor)
    return out


def _log_names(facts: NodeFacts) -> dict[str, tuple[str, str, str]]:
    """container id -> (namespace, pod, container) from /var/log/containers link names."""
    names = facts.root.listdir("/var/log/containers")
    out = {}
    if isinstance(names, Missing):
        return out
    for n in names:
        m = _LOG_LINK.match(n)
        if m:
            out[m.group("id")] = (m.group("ns"), m.group("pod"), m.group("ctr"))
    return out


def pod_names(facts: NodeFacts) -> dict[str, tuple[str, str]]:
    """pod uid -> (namespace, name) from the kubelet's /var/log/pods/<ns>_<name>_<uid> directories."""
    names = facts.root.listdir("/var/log/pods")
    if isinstance(names, Missing):
        return {}
    return {uid: (ns, name) for ns, name, uid in filter(None, map(cri_log.parse_pod_dir, names))}


def _pids(facts: NodeFacts, layout: CgroupLayout, base: str, rel: str) -> list[int]:
    text = facts.read_text(f"{base}/{rel}/cgroup.procs")
    if text is None:
        return []
    return [int(x) for x in text.split() if plausible.decimal(x)]


def _unified_cgroup(facts: NodeFacts, layout: CgroupLayout, c: Container) -> tuple[str | None, str]:
    """(path, why unknown): where the container sits in the unified hierarchy.

    The kernel's own word first (/proc/<pid>/cgroup: its "0::" line, absent when the process is
    in no unified hierarchy), else a directory of the same path there (systemd and runc create
    one on hybrid hosts), else unknown, with the reason.
    """
    if layout.version == 2:
        return c.cgroup, ""
    if layout.v2_mount is None:
        return None, ""
    for pid in c.pids[:1]:
        text = facts.root.read_text(f"/proc/{pid}/cgroup", 64 << 10)
        if isinstance(text, str):
            lines = proc_pid.cgroup_lines(text)
            for hid, ctrls, path in lines:
                # a reader inside another cgroup namespace sees "/../.." paths: not usable, look by name
                if hid == "0" and not ctrls and ".." not in path.split("/"):
                    return path.strip("/"), ""
            if lines and not any(hid == "0" and not ctrls for hid, ctrls, _ in lines):
                return None, ""  # the kernel lists every hierarchy the process is in: no unified one
    if not isinstance(facts.root.stat(f"{layout.v2_mount}/{c.cgroup}"), Missing):
        return c.cgroup, ""
    return None, (f"the container's unified cgroup was not found (no {layout.v2_mount}/{c.cgroup}, "
                  "no /proc/<pid>/cgroup naming one)")


def _parse_devices_list(memo: dict[str, tuple[list, list[str]]], text: str) -> tuple[list, list[str]]:
    """devices_list.parse, once per distinct text (most containers share a few lists); fresh lists
    per caller, the DeviceRule entries (frozen) shared."""
    got = memo.get(text)
    if got is None:
        got = memo[text] = devices_list.parse(text)
    return list(got[0]), list(got[1])


@fact("containers")
def collect_containers(facts: NodeFacts) -> ContainerFacts:
    layout = _layout(facts)
    base = _tree_base(layout)
    if base is None:
        raise FactUnavailable("no cgroup hierarchy to find pods in")
    kubepods = ""
    for cand, drv in (("kubepods.slice", "systemd"), ("kubepods", "cgroupfs")):
        if not isinstance(facts.root.stat(f"{base}/{cand}"), Missing):
            kubepods, layout.driver = cand, drv
            break
    if not kubepods:
        raise FactUnavailable(f"no kubepods cgroup under {base} (not a Kubernetes node, or kubelet not started)")
    by_log = _log_names(facts)
    by_uid = pod_names(facts)
    procs = facts.maybe("processes")
    parsed_lists: dict[str, tuple[list, list[str]]] = {}
    pods: list[Pod] = []
    for uid, qos, rel in _pod_dirs(facts, base, kubepods):
        ns, name = by_uid.get(uid, ("", ""))
        pod = Pod(uid, name, ns, qos, rel)
        for child in _children(facts, f"{base}/{rel}"):
            m = _CTR.match(child)
            if not m:
                continue
            cid = m.group(2)
            c = Container(cid, "", uid, f"{rel}/{child}", _RUNTIME_BY_PREFIX.get(m.group(1) or "", ""))
            c.pids = _pids(facts, layout, base, c.cgroup)
            if layout.version == 1:
                dl = f"{layout.v1_mounts.get('devices', base)}/{c.cgroup}/devices.list"
                text = facts.read_text(dl)
                if text is not None:
                    rules, bad = _parse_devices_list(parsed_lists, text)
                    c.device_rules, c.device_rules_source, c.device_rules_bad = rules, dl, len(bad)
                    if bad:
                        facts.gap(dl, f"{len(bad)} unparsable line(s), e.g. {bad[0][:60]!r}")
            view, src, runtime = _spec(facts, cid)
            if view is not None:
                c.spec_source = src
                c.runtime = c.runtime or runtime
                problem = _apply_spec(c, view)
                if problem:
                    facts.gap(src, problem)
            if cid in by_log:
                lns, lpod, lctr = by_log[cid]
                c.name = c.name or lctr
                if not pod.name:
                    pod.namespace, pod.name = lns, lpod
            if not pod.name and c.annotations:
                a = c.annotations
                pod.name = a.get("io.kubernetes.cri.sandbox-name") or a.get("io.kubernetes.pod.name") or ""
                pod.namespace = a.get("io.kubernetes.cri.sandbox-namespace") or a.get("io.kubernetes.pod.namespace") or ""
            c.unified_cgroup, c.unified_unknown = _unified_cgroup(facts, layout, c)
            if c.pids and not c.sandbox:
                c.dev_view = _dev_view(facts, c.pids[0])
                if procs is not None:
                    c.started_at = procs.start_time(facts, c.pids[0])
            pod.containers.append(c)
        pods.append(pod)
    return ContainerFacts(layout, pods, kubepods)
