"""Container runtime and device injection: the nvidia runtime, CDI specs, device nodes, requirements.

Reads the containerd (or CRI-O) configuration as TOML, CDI specs, the host's /dev, the
containers' own /dev views, their NVIDIA_* environment, and the runtime's and NVIDIA pods' logs.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, Iterator


from gpuwarden import known_versions as knowledge
from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.logs import NVIDIA_POD_HINTS
from gpuwarden.facts.xids import boot_time, in_current_boot
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.known_versions import parse_version
from gpuwarden.root import Missing, StatInfo, glob
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.plugin import latest_instance

SMI_XML = "/.gpuwarden/commands/nvidia-smi-q-x.xml"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_CONFIGS = ("/etc/crio/crio.conf", "/etc/crio/crio.conf.d/*")
GPU_PREFIX = "nvidia.com/"
MAX_QUOTED = 4
_VOID = ("", "void", "none")


def _events(facts: NodeFacts, *sig_ids: str, logs: tuple[str, ...] | None = None, current: bool = True) -> list[Any]:
    lf = facts.maybe("logs")
    if lf is None:
        return []
    boot = boot_time(facts) if current else None
    return [e for e in lf.events(*sig_ids, logs=logs)
            if not current or in_current_boot(e.time, boot) is not False]


# -- runtime configuration -----------------------------------------------------------------------------

#: where each containerd config version keeps the CRI plugin's runtimes
_CRI_KEYS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


@dataclass
class RuntimeConfig:
    engine: str  # "containerd" | "cri-o"
    sources: list[str]
    version: int | None = None
    handlers: dict[str, str] = field(default_factory=dict)  # handler -> binary ("" unknown)
    default: str = ""
    cdi: bool | None = None
    problems: list[str] = field(default_factory=list)

    def nvidia_handlers(self) -> list[str]:
        return [h for h, b in self.handlers.items() if h == "nvidia" or "nvidia-container-runtime" in b]


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _toml(facts: NodeFacts, path: str, text: str | None, problems: list[str]) -> dict | None:
    if text is None:
        text = facts.read_text(path)
    if text is None:
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"{path}: not valid TOML ({exc})")
        facts.gap(path, f"not valid TOML ({exc})")
        return None


def containerd_version(facts: NodeFacts) -> str | None:
    text = facts.read_text("/.gpuwarden/commands/containerd-version.txt")
    m = re.search(r"\sv?(\d+\.\d+\.\d+(?:[-~][\w.]+)?)", f" {text or ''}")
    return m.group(1) if m else None


def read_containerd(facts: NodeFacts) -> RuntimeConfig | None:
    rt = facts.maybe("runtime")
    problems: list[str] = []
    doc = _toml(facts, CONTAINERD_CONFIG, rt.containerd_config if rt is not None else None, problems)
    if doc is None:
        return RuntimeConfig("containerd", [CONTAINERD_CONFIG], problems=problems) if problems else None
    sources = [CONTAINERD_CONFIG]
    for pattern in doc.get("imports") or []:
        for p in glob(facts.root, str(pattern)) if any(c in str(pattern) for c in "*?[") else [str(pattern)]:
            sub = _toml(facts, p, None, problems)
            if sub is not None:
                doc = _merge(doc, {k: v for k, v in sub.items() if k != "imports"})
                sources.append(p)
    version = doc.get("version") if isinstance(doc.get("version"), int) else 1
    cfg = RuntimeConfig("containerd", sources, version, problems=problems)
    plugins = doc.get("plugins") or {}
    for v in sorted({version, 1, 2, 3}, key=lambda x: x != version):
        cri = plugins.get(_CRI_KEYS[v])
        if not isinstance(cri, dict):
            continue
        ctd = cri.get("containerd") if isinstance(cri.get("containerd"), dict) else {}
        for name, r in (ctd.get("runtimes") or {}).items():
            if isinstance(r, dict):
                opts = r.get("options") if isinstance(r.get("options"), dict) else {}
                cfg.handlers.setdefault(name, str(opts.get("BinaryName", "")))
        cfg.default = cfg.default or str(ctd.get("default_runtime_name", ""))
        if "enable_cdi" in cri and cfg.cdi is None:
            cfg.cdi = bool(cri["enable_cdi"])
    cfg.default = cfg.default or "runc"
    if cfg.cdi is None and version >= 3:
        cfg.cdi = True  # config version 3 is containerd 2.x, where enable_cdi defaults to true
    if cfg.cdi is None:
        ver = containerd_version(facts)
        cfg.cdi = True if ver and (v2 := parse_version(ver)) is not None and v2.release[:1] >= (2,) else None
    return cfg


def read_crio(facts: NodeFacts) -> RuntimeConfig | None:
    paths = []
    for pattern in CRIO_CONFIGS:
        paths += glob(facts.root, pattern) if "*" in pattern else [pattern]
    cfg: RuntimeConfig | None = None
    for p in paths:
        doc = _toml(facts, p, None, [])
        if doc is None:
            continue
        cfg = cfg or RuntimeConfig("cri-o", [], 1, cdi=True)  # CRI-O injects CDI devices natively
        cfg.sources.append(p)
        rt = ((doc.get("crio") or {}).get("runtime") or {})
        if rt.get("default_runtime"):
            cfg.default = str(rt["default_runtime"])
        for name, r in (rt.get("runtimes") or {}).items():
            if isinstance(r, dict):
                cfg.handlers[name] = str(r.get("runtime_path", ""))
    if cfg is not None:
        cfg.default = cfg.default or "crun"
    return cfg


def _gpu_node(facts: NodeFacts) -> bool:
    driver = facts.maybe("driver")
    if driver is not None and driver.gpus:
        return True
    kub = facts.maybe("kubelet")
    cp = kub.checkpoint if kub is not None else None
    return bool(cp and (any(r.startswith(GPU_PREFIX) for r in cp.registered)
                        or any(e.resource.startswith(GPU_PREFIX) for e in cp.entries)))


@rule(
    "GPU-K8S-004",
    title="NVIDIA container runtime missing from the containerd / CRI-O configuration",
    severity=Severity.HIGH,
    family="device-plugin",
    needs=(),
    automation="A2 (nvidia-ctk runtime configure; restart containerd)",
    remedy="""
        1. `nvidia-ctk runtime configure --runtime=containerd` (add `--set-as-default` when pods do not use
           `runtimeClassName: nvidia`), then `systemctl restart containerd` (running containers survive; it is still
           disruptive). CRI-O: `nvidia-ctk runtime configure --runtime=crio` and restart CRI-O.
        2. GPU Operator: delete the container-toolkit pod on the node so it re-applies the configuration (after a
           containerd restart or reboot it may have been lost: gpu-operator#1651).
        3. Or inject devices with CDI: containerd >= 1.7 with `enable_cdi = true` (default from 2.0) and the plugin's
           DEVICE_LIST_STRATEGY=cdi-cri.
        Then restart the device-plugin pod.
    """,
    references=knowledge.references("containerd-cdi-support")
    + ("NVIDIA/k8s-device-plugin internal/plugin/factory.go", "NVIDIA/k8s-device-plugin#1220",
       "NVIDIA/k8s-device-plugin#1574", "NVIDIA/gpu-operator#1651", "NVIDIA/gpu-operator#2646",
       "NVIDIA/nvidia-container-toolkit pkg/config/engine/containerd"),
)
def runtime_not_configured(facts: NodeFacts) -> Iterator[Hit]:
    """GPU containers get the driver and the GPUs only through the NVIDIA runtime (or CDI). When the
    runtime is not configured, the device plugin itself finds no NVML in its container
    ("Incompatible strategy detected auto" / "If this is a GPU node, did you configure the NVIDIA
    Container Toolkit?"), registers no GPUs, and pods with `runtimeClassName: nvidia` fail with
    `no runtime for "nvidia" is configured`.

    Reads /etc/containerd/config.toml with its `imports` (TOML; config versions 1, 2 and 3: the
    runtimes under plugins."cri" / "io.containerd.grpc.v1.cri" / "io.containerd.cri.v1.runtime",
    `default_runtime_name`, `enable_cdi`; taken to be the file containerd runs with), or CRI-O's
    crio.conf(.d); `containerd --version`; the
    device plugin's log and containerd's. RuntimeClass objects are not visible from the node: a
    `nvidia` handler that is not the default is taken as used through a RuntimeClass.

    CONFIRMED (high): the plugin's current instance logs the no-NVML lines, or containerd logs
    `no runtime for "nvidia" is configured`, in the current boot; on a live node, the nvidia
    handler's BinaryName does not exist.
    AT-RISK (medium): on a GPU node, the configuration has no nvidia handler at all and CDI is not
    enabled (or containerd is older than 1.7): nothing can inject GPUs.
    """
    cfg = read_containerd(facts) or read_crio(facts)
    logs = facts.maybe("logs")
    if cfg is None and logs is None:
        raise FactUnavailable(f"{CONTAINERD_CONFIG} and CRI-O configs unreadable, and no logs")
    cur, _ = latest_instance(facts, _events(facts, "plugin.incompatible-platform", "plugin.nvml-library-missing",
                                            logs=("pod",), current=False))
    handler = [e for e in _events(facts, "runtime.no-nvidia-handler", logs=("containerd",)) if "nvidia" in e.get("handler")]
    cfg_ev: list[Evidence] = []
    if cfg is not None:
        if cfg.handlers or cfg.version:
            cfg_ev.append(Evidence(cfg.sources[0], f"{cfg.engine} config" + (f" version {cfg.version}" if cfg.version else "")
                                   + f": runtimes {', '.join(sorted(cfg.handlers)) or 'none'}; default {cfg.default}"
                                   + ("" if cfg.cdi is None else f"; CDI {'enabled' if cfg.cdi else 'disabled'}")))
        cfg_ev += [Evidence(cfg.sources[0], p) for p in cfg.problems]
    if cur or handler:
        ev = [e.evidence() for e in (cur + handler)[-MAX_QUOTED:]] + cfg_ev
        who = [Affected("node", cfg.engine if cfg else "containerd", detail="nvidia runtime")]
        yield Hit(Status.CONFIRMED, "The NVIDIA container runtime is not in effect: "
                  + ("the device plugin finds no NVML in its container and registers no GPUs" if cur else
                     "pods asking for the nvidia RuntimeClass cannot start") + ".",
                  affected=who, evidence=ev,
                  data={"handlers": sorted(cfg.handlers) if cfg else [], "default": cfg.default if cfg else None})
        return
    if cfg is None or (not cfg.handlers and cfg.problems):
        return
    nv = cfg.nvidia_handlers()
    if nv and facts.root.live:
        missing = [(h, cfg.handlers[h]) for h in nv if cfg.handlers[h].startswith("/")
                   and isinstance(facts.root.stat(cfg.handlers[h]), Missing)]
        if missing:
            yield Hit(Status.CONFIRMED, f"The {missing[0][0]} runtime points at {missing[0][1]}, which does not exist: "
                                        "every container using it fails to start.",
                      affected=[Affected("node", cfg.engine, detail="nvidia runtime binary missing")],
                      evidence=cfg_ev + [Evidence(b, "does not exist") for _, b in missing], data={"missing": missing})
            return
    if nv or not _gpu_node(facts):
        return
    ver = containerd_version(facts) if cfg.engine == "containerd" else None
    old = knowledge.get("containerd-cdi-support").check(ver) if ver else None
    if cfg.cdi and not (old is not None and old.affected):
        return
    if old is not None and old.affected:
        cfg_ev.append(Evidence("/.gpuwarden/commands/containerd-version.txt", f"containerd {ver}: no CDI support before 1.7.0"))
    yield Hit(Status.AT_RISK, f"This GPU node's {cfg.engine} has no nvidia runtime and no CDI injection: the device plugin "
                              "and GPU pods get no driver libraries or GPU devices from the runtime.",
              affected=[Affected("node", cfg.engine, detail="nvidia runtime")], evidence=cfg_ev, severity=Severity.MEDIUM,
              data={"handlers": sorted(cfg.handlers), "default": cfg.default, "cdi": cfg.cdi})


# -- GPU-K8S-005 -------------------------------------------------------------------------------------

def _gpu_nodes_in(view: dict[str, tuple[int, int]] | None) -> list[str]:
    return sorted(p for p, (mj, mn) in (view or {}).items() if mj == 195 and mn < 254 and re.fullmatch(r"/dev/nvidia\d+", p))


@rule(
    "GPU-K8S-005",
    title="GPU allocated but absent in the container, or a container without a GPU request sees GPUs",
    severity=Severity.HIGH,
    family="device-plugin",
    needs=("containers", "kubelet"),
    automation="A3",
    remedy="""
        Allocated but absent: the container was created without the NVIDIA runtime (no `runtimeClassName: nvidia` and
        nvidia not the default runtime), so the plugin's NVIDIA_VISIBLE_DEVICES was ignored. Set the RuntimeClass on
        the pod (or make nvidia the default runtime, GPU-K8S-004), or use CDI (DEVICE_LIST_STRATEGY=cdi-cri), and
        recreate the pod.
        Unrequested GPUs: the image sets NVIDIA_VISIBLE_DEVICES=all and nvidia is the default runtime. Use the plugin's
        DEVICE_LIST_STRATEGY=volume-mounts (or cdi-*) with the toolkit's
        `accept-nvidia-visible-devices-envvar-when-unprivileged = false`.
    """,
    references=("NVIDIA/k8s-device-plugin README (DEVICE_LIST_STRATEGY)", "NVIDIA/deepops#381",
                "catalog GPU-K8S-005 (../shared/knowledge/signatures.md §3)"),
)
def gpu_absent_in_container(facts: NodeFacts) -> Iterator[Hit]:
    """The kubelet gave a container a GPU, but nothing put the GPU into it (or the reverse).

    Reads the kubelet checkpoint (which container holds which nvidia.com/* devices), each
    container's own /dev (/proc/<pid>/root/dev, captured by `collect`) and its NVIDIA_VISIBLE_DEVICES.

    CONFIRMED (high): a container the checkpoint assigns an nvidia.com/* device has no
    /dev/nvidia<N> in its /dev: `nvidia-smi: command not found` / "no CUDA-capable device is
    detected" (CUDA error 100).
    AT-RISK (medium): a container of a pod holding no nvidia.com/* device, not an NVIDIA component,
    with NVIDIA_VISIBLE_DEVICES set and GPU device nodes in its /dev: it uses GPUs the scheduler
    gave to others.
    """
    ctrs = facts.get("containers")
    kub = facts.get("kubelet")
    cp = kub.checkpoint
    if cp is None:
        raise FactUnavailable(f"{kub.checkpoint_path}: not readable")
    held: dict[tuple[str, str], list[Any]] = {}
    pods_with_gpu = set()
    for e in cp.entries:
        if e.resource.startswith(GPU_PREFIX):
            held.setdefault((e.pod_uid, e.container), []).append(e)
            pods_with_gpu.add(e.pod_uid)
    absent, extra = [], []
    for pod, c in ctrs.containers():
        if c.dev_view is None:
            continue
        nodes = _gpu_nodes_in(c.dev_view)
        entries = held.get((pod.uid, c.name))
        if entries and not nodes:
            absent.append((pod, c, entries))
        elif not entries and pod.uid not in pods_with_gpu and nodes:
            vis = c.env.get("NVIDIA_VISIBLE_DEVICES")
            name = f"{pod.namespace}_{pod.name}".lower()
            if vis is not None and vis.strip().lower() not in _VOID and not any(h in name for h in NVIDIA_POD_HINTS):
                extra.append((pod, c, nodes, vis))
    if absent:
        ev: list[Evidence] = []
        for pod, c, entries in absent[:MAX_QUOTED]:
            e = entries[0]
            ev.append(Evidence(kub.checkpoint_path, f"{e.resource} -> {', '.join(e.device_ids)} for {pod.ref} container {c.name}"))
            ev.append(Evidence(f"/proc/{c.pids[0]}/root/dev", "no /dev/nvidia<N> (NVIDIA nodes: "
                               + (", ".join(sorted(c.dev_view or {})) or "none") + ")"))
            if "NVIDIA_VISIBLE_DEVICES" in c.env:
                ev.append(Evidence(c.spec_source or "spec", f"NVIDIA_VISIBLE_DEVICES={c.env['NVIDIA_VISIBLE_DEVICES']}"))
        yield Hit(Status.CONFIRMED, f"{len(absent)} container(s) were allocated a GPU but have no GPU device in their /dev: "
                                    "CUDA finds no device (error 100), nvidia-smi is missing.",
                  affected=[Affected("container", f"{p.name or p.uid}/{c.ref}", p.namespace, p.uid) for p, c, _ in absent],
                  evidence=ev, mechanism="the container was not created by the NVIDIA runtime (or CDI), so the "
                                         "plugin's device selection was never applied",
                  data={"containers": [c.id for _, c, _ in absent]})
    if extra:
        yield Hit(Status.AT_RISK, f"{len(extra)} container(s) requested no GPU but see GPU device(s) through "
                                  "NVIDIA_VISIBLE_DEVICES: they use GPUs the scheduler gave to other pods.",
                  affected=[Affected("container", f"{p.name or p.uid}/{c.ref}", p.namespace, p.uid) for p, c, _, _ in extra],
                  evidence=[Evidence(f"/proc/{c.pids[0]}/root/dev", f"{', '.join(n)}; NVIDIA_VISIBLE_DEVICES={v}; "
                                     f"the checkpoint assigns {p.ref} no nvidia.com device")
                            for p, c, n, v in extra[:MAX_QUOTED]],
                  severity=Severity.MEDIUM, data={"containers": [c.id for _, c, _, _ in extra]})


# -- GPU-K8S-010 -------------------------------------------------------------------------------------

def driver_cuda(facts: NodeFacts) -> tuple[str | None, str]:
    """The CUDA version the driver supports ('13.0') and where it was read."""
    driver = facts.maybe("driver")
    if driver is not None and driver.smi is not None and driver.smi.cuda_version:
        return driver.smi.cuda_version, SMI_XML
    probes = facts.maybe("probes")
    v = getattr(getattr(probes, "nvml", None), "value", None)
    if isinstance(v, dict) and isinstance(v.get("cuda_driver_version"), int):
        n = v["cuda_driver_version"]
        return f"{n // 1000}.{(n % 1000) // 10}", "probe nvml"
    return None, ""


def _vt(text: str | None) -> tuple[int, ...] | None:
    v = parse_version(text)
    return v.release if v is not None else None


def requirement_met(req: str, cuda: str | None, driver: str | None, brand: str | None) -> bool | None:
    """Evaluate NVIDIA_REQUIRE_CUDA: space-separated alternatives (OR) of comma-separated conditions (AND).

    True / False when decided, None when a condition cannot be evaluated (unknown brand, version).
    """
    def cond(c: str) -> bool | None:
        m = re.fullmatch(r"(cuda|driver|brand|arch)\s*(>=|<=|==|=|>|<)\s*(\S+)", c.strip())
        if not m:
            return None
        key, op, want = m.groups()
        if key == "brand":
            return None if not brand else brand.lower() == want.lower()
        if key == "arch":
            return None
        have = _vt(cuda if key == "cuda" else driver)
        w = _vt(want)
        if have is None or w is None:
            return None
        n = max(len(have), len(w))
        a, b = have + (0,) * (n - len(have)), w + (0,) * (n - len(w))
        return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "==": a == b, "=": a == b}[op]
    results = []
    for alt in req.split():
        vals = [cond(c) for c in alt.split(",") if c]
        results.append(False if False in vals else None if None in vals else True)
    if True in results:
        return True
    if results and all(r is False for r in results):
        return False
    return None


@rule(
    "GPU-K8S-010",
    title="CUDA image requires a newer driver (unsatisfied condition: cuda>=X)",
    severity=Severity.MEDIUM,
    family="device-plugin",
    needs=(),
    automation="A3",
    remedy="""
        Use an image built for the node's CUDA version (nvidia-smi's "CUDA Version"), or upgrade the driver to one that
        supports the image's CUDA, or use the CUDA forward-compatibility package (data-centre GPUs). Setting
        NVIDIA_DISABLE_REQUIRE=true only skips the check: CUDA then fails at run time (error 803/804).
    """,
    references=("NVIDIA/nvidia-container-toolkit#152", "NVIDIA/nvidia-docker#1442",
                "NVIDIA/libnvidia-container (NVIDIA_REQUIRE_* evaluation)"),
)
def cuda_requires_newer_driver(facts: NodeFacts) -> Iterator[Hit]:
    """A CUDA image declares the CUDA version it needs (NVIDIA_REQUIRE_CUDA="cuda>=12.8 brand=tesla,
    driver>=535,driver<536 …": space-separated alternatives, comma-separated conditions); the NVIDIA
    hook refuses to start it on an older driver: `nvidia-container-cli: requirement error:
    unsatisfied condition: cuda>=12.8, please update your driver to a newer version, or use an
    earlier cuda container`.

    Reads that line in the kubelet / containerd logs of the current boot, the driver's CUDA version
    (nvidia-smi <cuda_version>, or NVML), the running GPU containers' NVIDIA_REQUIRE_CUDA.

    CONFIRMED (medium): the requirement error was logged and the required CUDA is still above the
    driver's (or the driver's CUDA version is unknown).
    AT-RISK (medium): a running container's NVIDIA_REQUIRE_CUDA is definitely unsatisfied by the
    current driver (it started on another driver or with NVIDIA_DISABLE_REQUIRE): it will not
    start again / CUDA fails in it.
    """
    cuda, src = driver_cuda(facts)
    evs = _events(facts, "runtime.cuda-requirement", logs=("kubelet", "containerd"))
    if not evs and facts.maybe("containers") is None and facts.maybe("logs") is None:
        raise FactUnavailable("no kubelet/containerd log and no containers")
    open_ = [e for e in evs if cuda is None or (_vt(e.get("required")) or ()) > (_vt(cuda) or ())]
    if open_:
        req = max((e.get("required") for e in open_), key=lambda r: _vt(r) or ())
        ev = [e.evidence() for e in open_[-MAX_QUOTED:]]
        if cuda:
            ev.append(Evidence(src, f"driver supports CUDA {cuda}"))
        yield Hit(Status.CONFIRMED, f"A container image requires CUDA >= {req} but the driver supports "
                                    + (f"CUDA {cuda}" if cuda else "an unknown, older CUDA") + ": it is refused at start.",
                  affected=[Affected("node", "nvidia driver", detail=f"CUDA {cuda or '?'}")], evidence=ev,
                  data={"required": req, "driver_cuda": cuda})
        return
    ctrs = facts.maybe("containers")
    driver = facts.maybe("driver")
    if ctrs is None or cuda is None:
        return
    dver = driver.version.version if driver is not None and driver.version else None
    brands = {g.fields.get("product_brand", "") for g in (driver.smi.gpus if driver is not None and driver.smi else [])}
    brand = next(iter(brands)) if len(brands) == 1 else None
    bad = []
    for pod, c in ctrs.containers():
        req = c.env.get("NVIDIA_REQUIRE_CUDA")
        if req and requirement_met(req, cuda, dver, brand) is False:
            bad.append((pod, c, req))
    if bad:
        yield Hit(Status.AT_RISK, f"{len(bad)} running container(s) require a newer CUDA than the driver's {cuda}: they "
                                  "cannot be restarted on this node (and CUDA inside may fail).",
                  affected=[Affected("container", f"{p.name or p.uid}/{c.ref}", p.namespace, p.uid) for p, c, _ in bad],
                  evidence=[Evidence(c.spec_source or "spec", f"NVIDIA_REQUIRE_CUDA={r}") for _, c, r in bad[:MAX_QUOTED]]
                  + [Evidence(src, f"driver {dver or '?'} supports CUDA {cuda}")],
                  severity=Severity.MEDIUM, data={"driver_cuda": cuda})


# -- GPU-DEV-004 -------------------------------------------------------------------------------------

def _expected_major(path: str, majors: dict[str, int]) -> tuple[str, int | None]:
    """(/proc/devices name, major) a NVIDIA device node must have."""
    base = path.rsplit("/", 1)[-1]
    if path.startswith("/dev/nvidia-caps-imex-channels/"):
        name = "nvidia-caps-imex-channels"
    elif path.startswith("/dev/nvidia-caps/"):
        name = "nvidia-caps"
    elif base.startswith("nvidia-uvm"):
        name = "nvidia-uvm"
    elif base.startswith("nvidia-nvswitch"):
        name = "nvidia-nvswitch"
    elif base.startswith("nvidia-nvlink"):
        name = "nvidia-nvlink"
    elif re.fullmatch(r"nvidia(\d+|ctl|-modeset)", base):
        return "nvidia", 195
    else:
        return "", None
    return name, majors.get(name)


_LIB_VERSION = re.compile(r"/lib(?:cuda|nvidia-[\w-]+|nvcuvid|nvoptix)\.so\.(\d{3}\.\d+(?:\.\d+)?)$")


def _cdi_docs(text: str) -> dict | None:
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return None
    else:
        import yaml  # only for a YAML spec (nvidia-ctk writes either): a check need not load a YAML parser

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            return None
    return doc if isinstance(doc, dict) else None


def _cdi_edits(doc: dict) -> list[dict]:
    edits = [doc.get("containerEdits")] + [d.get("containerEdits") for d in doc.get("devices") or [] if isinstance(d, dict)]
    return [e for e in edits if isinstance(e, dict)]


@rule(
    "GPU-DEV-004",
    title="Stale NVIDIA device major: a /dev node, /dev/char link or CDI spec points at an old major or driver",
    severity=Severity.HIGH,
    family="device-access",
    needs=("driver",),
    automation="A1 (recreate nodes, links, CDI spec) + A2 (recreate pods)",
    remedy="""
        1. Recreate the device nodes: remove the stale ones and run `nvidia-modprobe -u -c=0` (and `-m` for
           nvidia-modeset; MIG caps: `nvidia-modprobe -f /proc/driver/nvidia-caps/mig-minors`).
        2. Recreate the /dev/char links: `nvidia-ctk system create-dev-char-symlinks --create-all` (toolkit >= 1.12).
        3. Regenerate CDI: `systemctl restart nvidia-cdi-refresh.service`, or
           `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` (and /etc/cdi if a spec lives there too).
        4. Recreate the GPU pods created since the driver reload.
    """,
    references=knowledge.references("toolkit-create-dev-char-symlinks")
    + ("NVIDIA/NemoClaw#4733", "NVIDIA/nvidia-container-toolkit#1611", "NVIDIA/nvidia-container-toolkit#1517",
       "NVIDIA/nvidia-container-toolkit#1828", "NVIDIA/nvidia-container-toolkit#450", "NixOS/nixpkgs#285148",
       "NVIDIA/cloud-native-docs PR #83", "NVIDIA/cloud-native-docs PR #203"),
)
def stale_major(facts: NodeFacts) -> Iterator[Hit]:
    """nvidia-uvm, nvidia-caps and nvidia-nvswitch get a dynamic major each time their module loads;
    nodes, /dev/char links and CDI specs made before a module reload keep the old one. Containers
    then get a device rule for a major that no longer exists: nvidia-smi works, CUDA (uvm) or MIG
    (caps) fails; or, after a driver upgrade, the CDI spec mounts libraries of the old version.

    Reads /proc/devices (the majors now), the host's NVIDIA /dev nodes (stat), /dev/char links
    pointing at NVIDIA nodes, and CDI specs in /etc/cdi and /var/run/cdi (`containerEdits.deviceNodes`
    with major/minor, and the version in mounted driver libraries' names, e.g.
    libcuda.so.570.158.01). Only nodes whose name has a /proc/devices entry are checked (a module
    that is not loaded is GPU-DRV-003's).

    CONFIRMED (high): a node's major differs from /proc/devices'; a /dev/char/M:m link whose target
    is missing or has another major:minor; a CDI deviceNode with a stale major; a CDI spec whose
    driver libraries are of another version than the loaded module.
    """
    driver = facts.get("driver")
    majors = driver.devices.nvidia_majors()
    if not majors:
        return
    found: dict[str, list[Evidence]] = {}
    for path, st in sorted(driver.nodes.items()):
        name, want = _expected_major(path, majors)
        if want is not None and st.major is not None and st.major != want:
            found.setdefault("stale_node", []).append(
                Evidence(path, f"char {st.major}:{st.minor}, but /proc/devices says {want} {name}"))
    names = facts.root.listdir("/dev/char")
    for n in ([] if isinstance(names, Missing) else names):
        link = f"/dev/char/{n}"
        target = facts.root.readlink(link)
        if not isinstance(target, str) or "nvidia" not in target:
            continue
        m = re.fullmatch(r"(\d+):(\d+)", n)
        tpath = target if target.startswith("/") else "/dev/" + target.split("../", 1)[-1].lstrip("/")
        st = facts.root.stat(tpath)
        if not isinstance(st, StatInfo):
            if st.kind == "missing":
                found.setdefault("stale_link", []).append(Evidence(link, f"-> {target}, which does not exist"))
            continue
        if m and st.major is not None and (int(m.group(1)), int(m.group(2))) != (st.major, st.minor):
            found.setdefault("stale_link", []).append(
                Evidence(link, f"-> {target}, which is char {st.major}:{st.minor}"))
    rt = facts.maybe("runtime")
    module = driver.version.version if driver.version else None
    for path, text in sorted((rt.cdi_specs if rt is not None else {}).items()):
        doc = _cdi_docs(text)
        if doc is None:
            continue
        versions: set[str] = set()
        for edits in _cdi_edits(doc):
            for dn in edits.get("deviceNodes") or []:
                if not isinstance(dn, dict) or not isinstance(dn.get("major"), int):
                    continue
                name, want = _expected_major(str(dn.get("path", "")), majors)
                if want is not None and dn["major"] != want:
                    found.setdefault("stale_cdi", []).append(
                        Evidence(path, f"deviceNodes {dn.get('path')} major {dn['major']}, but /proc/devices says {want} {name}"))
            for mnt in edits.get("mounts") or []:
                hp = str(mnt.get("hostPath", "")) if isinstance(mnt, dict) else ""
                mm = _LIB_VERSION.search(hp)
                if mm:
                    versions.add(mm.group(1))
        if module and versions and module not in versions:
            found.setdefault("stale_cdi_libs", []).append(
                Evidence(path, f"mounts driver libraries of version {', '.join(sorted(versions))}; the loaded module is {module}"))
    if not found:
        return
    what = {"stale_node": "device nodes", "stale_link": "/dev/char links", "stale_cdi": "CDI device nodes",
            "stale_cdi_libs": "CDI driver libraries"}
    ev = [e for k in found for e in found[k][:MAX_QUOTED]]
    ev.append(Evidence("/proc/devices", ", ".join(f"{m} {n}" for n, m in sorted(majors.items(), key=lambda x: x[1]))))
    if module and "stale_cdi_libs" in found:
        ev.append(Evidence("/proc/driver/nvidia/version", driver.version.line))
    yield Hit(Status.CONFIRMED, "Stale NVIDIA " + ", ".join(what[k] for k in found)
              + " no longer match the loaded driver: containers get rules for a dead major or old libraries "
                "(CUDA or MIG fails while nvidia-smi works).",
              affected=[Affected("node", "nvidia device nodes")], evidence=ev, mechanism=", ".join(found),
              data={"kinds": sorted(found)})


# -- GPU-DEV-005 -------------------------------------------------------------------------------------

AUDIT_LOG = "/var/log/audit/audit.log"
_AVC = re.compile(r'avc:\s+denied\s+\{(?P<perms>[^}]*)\}.*?comm="(?P<comm>[^"]*)".*?name="(?P<name>nvidia[^"]*)"'
                  r'.*?scontext=(?P<scontext>\S+).*?tclass=(?P<tclass>\S+)')


def _avc_denials(facts: NodeFacts) -> list[Evidence]:
    """AVC denials on nvidia* device nodes from the audit log (live /var/log/audit, or a bundle's copy)."""
    from gpuwarden.facts.logscan import Decoded, Signature, scan

    out: list[Evidence] = []
    for path in (AUDIT_LOG, "/.gpuwarden/logs/audit.log"):
        stream = facts.root.open_binary(path)
        if isinstance(stream, Missing):
            if stream.kind not in ("missing",):
                facts.gap(stream)
            continue
        sig = Signature("selinux.avc-nvidia", b"nvidia", _AVC, frozenset(), keep=20)
        try:
            got = scan(stream, [sig], lambda t: Decoded(t), log="audit", source=path, fmt="audit", max_bytes=64 << 20)
        finally:
            stream.close()
        out += [e.evidence() for e in got.events[-MAX_QUOTED:]]
        break
    return out


@rule(
    "GPU-DEV-005",
    title="NVML 'Insufficient Permissions' in containers (SELinux denies the NVIDIA device nodes)",
    severity=Severity.MEDIUM,
    family="device-access",
    needs=(),
    automation="A3",
    remedy="""
        Let containers use the NVIDIA devices under SELinux: install the NVIDIA / container-selinux policy for GPU
        devices (the GPU Operator's and RHEL's guides), or label the device nodes for container access; for a single
        workload `--security-opt=label=disable` / `seLinuxOptions.type: spc_t` disables separation (a security
        trade-off). Check `ausearch -m AVC -ts recent | grep nvidia`.
    """,
    references=("NVIDIA/cloud-native-docs container-toolkit/troubleshooting.md",
                "catalog GPU-DEV-005 (../shared/knowledge/signatures.md §2)"),
)
def selinux_denied(facts: NodeFacts) -> Iterator[Hit]:
    """On SELinux-enforcing hosts, a container's process may be denied the NVIDIA device nodes by
    policy even though its device cgroup allows them: `Failed to initialize NVML: Insufficient
    Permissions`.

    Reads "Insufficient Permissions" NVML errors (and the NVIDIA hook's "nvml error: insufficient
    permissions") in kubelet, containerd and NVIDIA pod logs (current boot),
    /sys/fs/selinux/enforce, and AVC denials on nvidia* nodes in /var/log/audit/audit.log when it
    can be read (`collect` does not capture the audit log: it can hold secrets; a bundle may carry
    an excerpt as /.gpuwarden/logs/audit.log).

    CONFIRMED (medium): AVC denials on nvidia* device nodes; or the NVML error while SELinux is
    enforcing.
    AT-RISK (low): the NVML error while SELinux is not enforcing or unknown (other causes:
    device-node modes, NVreg_DeviceFileMode/UID/GID).
    """
    perm = _events(facts, "nvml.error", "runtime.container-cli-error", logs=("kubelet", "containerd", "pod"))
    perm = [e for e in perm if "insufficient permissions" in e.line.lower()]
    avc = _avc_denials(facts)
    enforce = facts.read_text("/sys/fs/selinux/enforce")
    if not perm and not avc:
        if facts.maybe("logs") is None and enforce is None:
            raise FactUnavailable("no logs, no audit log and no /sys/fs/selinux/enforce")
        return
    ev = [e.evidence() for e in perm[-MAX_QUOTED:]] + avc
    if enforce is not None:
        ev.append(Evidence("/sys/fs/selinux/enforce", enforce.strip()))
    enforcing = enforce is not None and enforce.strip() == "1"
    if avc or enforcing:
        yield Hit(Status.CONFIRMED, "SELinux denies containers the NVIDIA device nodes: NVML fails with 'Insufficient "
                                    "Permissions' although the device cgroup allows them.",
                  affected=[Affected("node", "selinux", detail="enforcing" if enforcing else "")], evidence=ev,
                  data={"enforcing": enforcing, "avc": len(avc)})
    else:
        yield Hit(Status.AT_RISK, "NVML reports 'Insufficient Permissions' in a container; SELinux is not enforcing (or "
                                  "unknown), so check the device nodes' modes and the driver's NVreg_DeviceFile* settings.",
                  affected=[Affected("node", "nvidia device nodes")], evidence=ev, severity=Severity.LOW,
                  data={"enforcing": enforcing})
