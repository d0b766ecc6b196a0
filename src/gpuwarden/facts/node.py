"""NodeFacts: lazy, memoised fact sections with recorded gaps."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from gpuwarden.findings import Gap
from gpuwarden.root import Missing, Root

T = TypeVar("T")

#: section name -> collector(facts) -> value
_COLLECTORS: dict[str, Callable[["NodeFacts"], Any]] = {}

#: modules that register collectors; imported on first use so `import gpuwarden` stays cheap
_FACT_MODULES = (
    "gpuwarden.facts.identity",
    "gpuwarden.facts.driver",
    "gpuwarden.facts.kubelet",
    "gpuwarden.facts.containers",
    "gpuwarden.facts.memory",
    "gpuwarden.facts.logs",
    "gpuwarden.facts.mps",
    "gpuwarden.facts.processes",
    "gpuwarden.facts.plugin",
    "gpuwarden.facts.gpu_access",
    "gpuwarden.facts.bpf_access",
    "gpuwarden.facts.runtime",
    "gpuwarden.facts.live",
    "gpuwarden.facts.pci",
    "gpuwarden.facts.xids",
)


class FactUnavailable(Exception):
    """A section cannot be built: its sources are missing or unreadable."""


def fact(name: str) -> Callable[[Callable[["NodeFacts"], T]], Callable[["NodeFacts"], T]]:
    """Register the collector of one fact section."""

    def deco(fn: Callable[["NodeFacts"], T]) -> Callable[["NodeFacts"], T]:
        if name in _COLLECTORS and _COLLECTORS[name] is not fn:
            raise ValueError(f"fact section {name!r} registered twice")
        _COLLECTORS[name] = fn
        return fn

    return deco


#: fact modules that failed to import -> why; their sections are unavailable, the rest still work
IMPORT_ERRORS: dict[str, str] = {}


def registered_facts() -> dict[str, Callable[["NodeFacts"], Any]]:
    for mod in _FACT_MODULES:
        if mod in IMPORT_ERRORS:
            continue
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                IMPORT_ERRORS[mod] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a broken module must not take every other section down
            IMPORT_ERRORS[mod] = f"{type(exc).__name__}: {exc}"
    return _COLLECTORS


@dataclass
class Settings:
    """Thresholds and switches the rules read; defaults are documented in docs/rules.md."""

    #: GPU-K8S-001: an Allocate/GetPreferredAllocation with no follow-up for this long is a hang
    plugin_call_stall_s: float = 60.0
    #: GPU-NODE-001: uncharged memory beyond a healthy node's baseline that is large on any node
    #: (docs/memory.md); an optional share of MemTotal on top of it (0: off, an absolute floor only)
    unexplained_mem_ratio: float = 0.0
    unexplained_mem_min_bytes: int = 4 << 30
    #: live probes
    probes: bool = True
    probe_timeout_s: float = 5.0
    probe_access: bool = False
    #: ask each device-plugin socket the kubelet's calls (probes/plugin.py); `check` turns it on, the
    #: agent leaves it off (its plugin monitor makes the same calls)
    plugin_probe: bool = False
    #: log windows
    log_max_bytes: int = 2 << 30
    #: scan only the last this-many seconds of the kubelet and containerd logs (None: whole files);
    #: a device-plugin call older than the window is still looked for (docs/logs.md "Bounded scans")
    log_window_s: float | None = None
    #: a gpuwarden.facts.logs.LogCursors kept by a long-running caller (the agent) across checks:
    #: each check then scans only what every log gained since the previous one
    log_cursors: Any = None
    #: a gpuwarden.memtrend.MemoryHistory kept by the agent across checks: the memory section adds
    #: one sample per check and reads the growth rate and time to exhaustion from it
    memory_history: Any = None
    kubelet_log: str | None = None
    containerd_log: str | None = None
    kernel_log: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class NodeFacts:
    """Everything the rules know about one node."""

    def __init__(self, root: Root, settings: Settings | None = None, now: float | None = None) -> None:
        self.root = root
        self.settings = settings or Settings()
        self._values: dict[str, Any] = {}
        self._failed: dict[str, str] = {}
        self._gaps: dict[str, str] = {}
        self.errors: list[str] = []
        #: probes started before the check (facts.live.start_early), collected by their section
        self.early: dict[str, Any] = {}
        self.now = now if now is not None else self._captured_at() or time.time()

    def _captured_at(self) -> float | None:
        meta = getattr(self.root, "meta_merged", None)
        if isinstance(meta, dict) and isinstance(meta.get("captured_at"), (int, float)):
            return float(meta["captured_at"])
        return None

    # -- gaps -------------------------------------------------------------
    def gap(self, source: str | Missing, reason: str = "") -> None:
        """Record evidence that could not be read."""
        if isinstance(source, Missing):
            self._gaps.setdefault(source.path, f"{source.kind}{': ' + source.detail if source.detail else ''}")
        else:
            self._gaps.setdefault(source, reason)

    def gaps(self) -> list[Gap]:
        return [Gap(s, r) for s, r in sorted(self._gaps.items())]

    # -- sections ---------------------------------------------------------
    def get(self, name: str) -> Any:
        """The section's value; raises FactUnavailable with the reason."""
        if name in self._values:
            return self._values[name]
        if name in self._failed:
            raise FactUnavailable(self._failed[name])
        collectors = registered_facts()
        if name not in collectors:
            broken = "; ".join(f"{m}: {e}" for m, e in IMPORT_ERRORS.items())
            raise FactUnavailable(f"no collector for {name!r}" + (f" (failed to import {broken})" if broken else ""))
        try:
            value = collectors[name](self)
        except FactUnavailable as exc:
            self._failed[name] = str(exc)
            raise
        except Exception as exc:  # a collector bug must not take the report down
            msg = f"collector {name} failed: {type(exc).__name__}: {exc}"
            self.errors.append(msg)
            self._failed[name] = msg
            raise FactUnavailable(msg) from exc
        self._values[name] = value
        return value

    def maybe(self, name: str) -> Any | None:
        """The section, or None when it is unavailable (for optional evidence)."""
        try:
            return self.get(name)
        except FactUnavailable:
            return None

    def set(self, name: str, value: Any) -> None:
        """Inject a section (the agent's history, tests)."""
        self._values[name] = value

    def read_text(self, path: str, max_bytes: int | None = None) -> str | None:
        """Read through the root, recording a gap on failure."""
        r = self.root.read_text(path, max_bytes) if max_bytes else self.root.read_text(path)
        if isinstance(r, Missing):
            if r.kind != "missing":
                self.gap(r)
            return None
        return r
