"""The container runtime's GPU injection: the nvidia runtime, GPUs in containers, CUDA requirements (GPU-K8S-004/005/010).

Reads the containerd (or CRI-O) configuration, the containers' own /dev views, their NVIDIA_*
environment, the driver's CUDA version, and the runtime's and NVIDIA pods' logs.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

from gpuwarden import known_versions
from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.logs import NVIDIA_POD_HINTS
from gpuwarden.facts.nvidia_smi import SMI_XML
from gpuwarden.facts.runtime_config import CONTAINERD_CONFIG, CONTAINERD_VERSION, RuntimeConfig
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.known_versions import parse_version
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.logview import events
from gpuwarden.rules.plugin import latest_instance

GPU_PREFIX = "nvidia.com/"
MAX_QUOTED = 4
_VOID = ("", "void", "none")


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
    uses=("boot", "driver", "kubelet", "logs", "runtime_config"),
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
    references=known_versions.references("containerd-cdi-support")
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
    cfg: RuntimeConfig | None = facts.maybe("runtime_config")
    logs = facts.maybe("logs")
    if cfg is None and logs is None:
        raise FactUnavailable(f"{CONTAINERD_CONFIG} and CRI-O configs unreadable, and no logs")
    cur, _ = latest_instance(facts, events(facts, "plugin.incompatible-platform", "plugin.nvml-library-missing",
                                            logs=("pod",), current=False))
    handler = [e for e in events(facts, "runtime.no-nvidia-handler", logs=("containerd",)) if "nvidia" in e.get("handler")]
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
    if nv:
        missing = cfg.missing_binaries
        if missing:
            yield Hit(Status.CONFIRMED, f"The {missing[0][0]} runtime points at {missing[0][1]}, which does not exist: "
                                        "every container using it fails to start.",
                      affected=[Affected("node", cfg.engine, detail="nvidia runtime binary missing")],
                      evidence=cfg_ev + [Evidence(b, "does not exist") for _, b in missing], data={"missing": missing})
            return
    if nv or not _gpu_node(facts):
        return
    ver = cfg.containerd_version if cfg.engine == "containerd" else None
    old = known_versions.get("containerd-cdi-support").check(ver) if ver else None
    if cfg.cdi and not (old is not None and old.affected):
        return
    if old is not None and old.affected:
        cfg_ev.append(Evidence(CONTAINERD_VERSION, f"containerd {ver}: no CDI support before 1.7.0"))
    yield Hit(Status.AT_RISK, f"This GPU node's {cfg.engine} has no nvidia runtime and no CDI injection: the device plugin "
                              "and GPU pods get no driver libraries or GPU devices from the runtime.",
              affected=[Affected("node", cfg.engine, detail="nvidia runtime")], evidence=cfg_ev, severity=Severity.MEDIUM,
              data={"handlers": sorted(cfg.handlers), "default": cfg.default, "cdi": cfg.cdi})


# -- GPU-K8S-005 -------------------------------------------------------------------------------------

def _gpu_nodes_in(view: dict[str, tuple[int, int]] | None) -> list[str]:
    return sorted(p for p, (mj, mn) in (view or {}).items() if mj == 195 and mn < 254 and re.fullmatch(r"/dev/nvidia[0-9]+", p))


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
    uses=("boot", "containers", "driver", "logs", "probes"),
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
    evs = events(facts, "runtime.cuda-requirement", logs=("kubelet", "containerd"))
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
