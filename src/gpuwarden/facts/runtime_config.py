"""The `runtime_config` fact: the container runtime's configuration as the runtime reads it.

containerd's /etc/containerd/config.toml with its `imports` (TOML; config versions 1, 2 and 3: the
runtimes under plugins."cri" / "io.containerd.grpc.v1.cri" / "io.containerd.cri.v1.runtime",
`default_runtime_name`, `enable_cdi`), or CRI-O's crio.conf(.d); `containerd --version` as captured;
on a live node, whether the nvidia handlers' binaries exist.
"""

from __future__ import annotations

import re

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.known_versions import parse_version
from gpuwarden.root import Missing, glob

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_CONFIGS = ("/etc/crio/crio.conf", "/etc/crio/crio.conf.d/*")
CONTAINERD_VERSION = "/.gpuwarden/commands/containerd-version.txt"

#: where each containerd config version keeps the CRI plugin's runtimes
_CRI_KEYS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


class RuntimeConfig(Struct):
    """The container runtime's config: handlers, default runtime and CDI."""
    engine: str  # "containerd" | "cri-o"
    sources: list[str]
    version: int | None = None
    handlers: dict[str, str] = field(default_factory=dict)  # handler -> binary ("" unknown)
    default: str = ""
    cdi: bool | None = None
    problems: list[str] = field(default_factory=list)
    #: `containerd --version` as captured (containerd, when CDI support or a missing nvidia handler
    #: depends on it; None: unknown or not read)
    containerd_version: str | None = None
    #: on a live node, nvidia handlers whose binary (an absolute path) does not exist: (handler, path)
    missing_binaries: list[tuple[str, str]] = field(default_factory=list)

    def nvidia_handlers(self) -> list[str]:
        return [h for h, b in self.handlers.items() if h == "nvidia" or "nvidia-container-runtime" in b]


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _toml(facts: NodeFacts, path: str, problems: list[str]) -> dict | None:
    text = facts.read_text(path)
    if text is None:
        return None
    import tomllib  # here: a node without a runtime config (a bundle of facts only) never needs the parser

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"{path}: not valid TOML ({exc})")
        facts.gap(path, f"not valid TOML ({exc})")
        return None


def containerd_version(facts: NodeFacts) -> str | None:
    text = facts.read_text(CONTAINERD_VERSION)
    m = re.search(r"\sv?([0-9]+\.[0-9]+\.[0-9]+(?:[-~][\w.]+)?)", f" {text or ''}")
    return m.group(1) if m else None


def read_containerd(facts: NodeFacts) -> RuntimeConfig | None:
    problems: list[str] = []
    doc = _toml(facts, CONTAINERD_CONFIG, problems)
    if doc is None:
        return RuntimeConfig("containerd", [CONTAINERD_CONFIG], problems=problems) if problems else None
    sources = [CONTAINERD_CONFIG]
    for pattern in doc.get("imports") or []:
        for p in glob(facts.root, str(pattern)) if any(c in str(pattern) for c in "*?[") else [str(pattern)]:
            sub = _toml(facts, p, problems)
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
    if cfg.cdi is None or not cfg.nvidia_handlers():  # read only where GPU-K8S-004 weighs it
        cfg.containerd_version = containerd_version(facts)
    if cfg.cdi is None:
        ver = cfg.containerd_version
        cfg.cdi = True if ver and (v2 := parse_version(ver)) is not None and v2.release[:1] >= (2,) else None
    return cfg


def read_crio(facts: NodeFacts) -> RuntimeConfig | None:
    paths = []
    for pattern in CRIO_CONFIGS:
        paths += glob(facts.root, pattern) if "*" in pattern else [pattern]
    cfg: RuntimeConfig | None = None
    for p in paths:
        doc = _toml(facts, p, [])
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


@fact("runtime_config")
def collect_runtime_config(facts: NodeFacts) -> RuntimeConfig:
    cfg = read_containerd(facts) or read_crio(facts)
    if cfg is None:
        raise FactUnavailable(f"{CONTAINERD_CONFIG} and CRI-O configs unreadable")
    if facts.root.live:
        cfg.missing_binaries = [(h, cfg.handlers[h]) for h in cfg.nvidia_handlers() if cfg.handlers[h].startswith("/")
                                and isinstance(facts.root.stat(cfg.handlers[h]), Missing)]
    return cfg
