"""NodeFacts: lazy, memoised fact sections with recorded gaps."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from msgspec import Struct, field

from gpuwarden.findings import Gap
from gpuwarden.parsers import plausible
from gpuwarden.isolated_import import import_isolated
from gpuwarden.root import Missing, Root

if TYPE_CHECKING:
    from gpuwarden.memory.trend import MemoryHistory

T = TypeVar("T")

#: section name -> collector(facts) -> value
_COLLECTORS: dict[str, Callable[["NodeFacts"], Any]] = {}

#: section -> the module that registers its collector, imported when the section is first asked
#: for, so a check imports only the collectors (and parsers) its rules need
_FACT_MODULES: dict[str, str] = {
    "identity": "gpuwarden.facts.identity",
    "driver": "gpuwarden.facts.driver",
    "kubelet": "gpuwarden.facts.kubelet",
    "containers": "gpuwarden.facts.containers",
    "memory": "gpuwarden.facts.memory",
    "logs": "gpuwarden.facts.logs",
    "mps": "gpuwarden.facts.mps",
    "processes": "gpuwarden.facts.processes",
    "plugin": "gpuwarden.facts.plugin",
    "plugin_pod": "gpuwarden.facts.plugin",
    "gpu_access": "gpuwarden.facts.gpu_access",
    "bpf_programs": "gpuwarden.facts.bpf_programs",
    "runtime": "gpuwarden.facts.runtime",
    "runtime_config": "gpuwarden.facts.runtime_config",
    "reapply": "gpuwarden.facts.reapply",
    "probes": "gpuwarden.facts.probes",
    "pci": "gpuwarden.facts.pci",
    "xids": "gpuwarden.facts.xids",
    "boot": "gpuwarden.facts.boot",
    "nvidia_smi": "gpuwarden.facts.nvidia_smi",
    "dev_char": "gpuwarden.facts.dev_char",
    "selinux": "gpuwarden.facts.selinux",
    "plugin_sockets": "gpuwarden.facts.plugin_sockets",
    "inotify": "gpuwarden.facts.inotify",
    "gpu_operator": "gpuwarden.facts.gpu_operator",
    "cdi": "gpuwarden.facts.cdi",
    "dra": "gpuwarden.facts.dra",
    "dra_probe": "gpuwarden.facts.dra_probe",
    "admissions": "gpuwarden.facts.admissions",
}


class FactUnavailable(Exception):
    """A section cannot be built: its sources are missing or unreadable."""


class NotApplicable(FactUnavailable):
    """The node has no such thing (no DRA): the rules that need the section do not apply to it.

    Not a gap: such rules are reported apart ("not applicable"), out of the not-checked count and of
    the share of rules a verdict needs. Raised only on evidence that the thing is absent, never
    because its evidence could not be read (that is FactUnavailable).
    """


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
    """Every section's collector (imports all fact modules)."""
    for mod in _FACT_MODULES.values():
        import_isolated(mod, IMPORT_ERRORS)
    return _COLLECTORS


def collector(name: str) -> Callable[["NodeFacts"], Any] | None:
    """The collector of one section, importing only its module (all of them for an unknown name)."""
    if name not in _COLLECTORS:
        mod = _FACT_MODULES.get(name)
        if mod is not None:
            import_isolated(mod, IMPORT_ERRORS)
        if name not in _COLLECTORS:
            registered_facts()
    return _COLLECTORS.get(name)


class Settings(Struct):
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
    #: a gpuwarden.logs.cursors.LogCursors kept by a long-running caller (the agent) across checks:
    #: each check then scans only what every log gained since the previous one
    log_cursors: Any = None
    #: the agent's memory samples of earlier checks (read only here): the memory section fits the growth
    #: rate, the time to exhaustion and the arrivals over them plus this check's sample, which it returns
    #: as `MemoryFacts.sample` for the agent to record
    memory_history: MemoryHistory | None = None
    kubelet_log: str | None = None
    #: the agent's reader of its node's pods from the API server (facts/admissions.py); None
    #: elsewhere. Called at most once a check, and only when a rule asks for the section
    admission_pods: Callable[[], Any] | None = None
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
        self._absent: set[str] = set()  # sections whose collector said NotApplicable
        self._gaps: dict[str, str] = {}
        self.errors: list[str] = []
        #: probes started before the check (facts.probes.start_early), collected by their section
        self.early: dict[str, Any] = {}
        #: section -> the sections its collector asked for (what makes it stale when they change: `inherit`)
        self.deps: dict[str, set[str]] = {}
        self._collecting: list[str] = []
        self._gaps_of: dict[str, list[str]] = {}  # section -> the gaps recorded while it was collected
        #: sections taken from an earlier check's facts (`inherit`), not read in this one
        self.reused: set[str] = set()
        self.now = now if now is not None else self._captured_at() or time.time()
        layer = root
        while layer is not None:  # a bundle manifest's entries of the wrong type, dropped with the reason
            for where, why in getattr(layer, "problems", ())[:20]:
                self.gap(where, f"unreadable: {why}")
            layer = getattr(layer, "lower", None)

    def _captured_at(self) -> float | None:
        meta = getattr(self.root, "meta_merged", None)
        if isinstance(meta, dict) and isinstance(meta.get("captured_at"), (int, float)):
            if plausible.timestamp(meta["captured_at"]):
                return float(meta["captured_at"])
            self.gap("meta.json captured_at", f"unreadable: {meta['captured_at']!r} is not a time a node can have "
                                              "(2000 .. 2200); the check's own clock is used")
        return None

    # -- gaps -------------------------------------------------------------
    def gap(self, source: str | Missing, reason: str = "") -> None:
        """Record evidence that could not be read."""
        if isinstance(source, Missing):
            key = source.path
            self._gaps.setdefault(key, f"{source.kind}{': ' + source.detail if source.detail else ''}")
        else:
            key = source
            self._gaps.setdefault(key, reason)
        if self._collecting:
            self._gaps_of.setdefault(self._collecting[-1], []).append(key)

    def gaps(self) -> list[Gap]:
        return [Gap(s, r) for s, r in sorted(self._gaps.items())]

    # -- sections ---------------------------------------------------------
    def get(self, name: str) -> Any:
        """The section's value; raises FactUnavailable with the reason."""
        if self._collecting:
            self.deps.setdefault(self._collecting[-1], set()).add(name)
        if name in self._values:
            return self._values[name]
        if name in self._failed:
            raise (NotApplicable if name in self._absent else FactUnavailable)(self._failed[name])
        collect = collector(name)
        if collect is None:
            broken = "; ".join(f"{m}: {e}" for m, e in IMPORT_ERRORS.items())
            raise FactUnavailable(f"no collector for {name!r}" + (f" (failed to import {broken})" if broken else ""))
        self._collecting.append(name)
        try:
            value = collect(self)
        except FactUnavailable as exc:
            self._failed[name] = str(exc)
            if isinstance(exc, NotApplicable):
                self._absent.add(name)
            raise
        except Exception as exc:  # a collector bug must not take the report down
            msg = f"collector {name} failed: {type(exc).__name__}: {exc}"
            self.errors.append(msg)
            self._failed[name] = msg
            raise FactUnavailable(msg) from exc
        finally:
            self._collecting.pop()
        self._values[name] = value
        return value

    def inherit(self, prev: "NodeFacts", changed: set[str] | frozenset[str]) -> set[str]:
        """Take from `prev` (an earlier check's facts of the same root and settings) every section it read
        that is not stale: not in `changed` and not built from one that is (the sections each collector asked
        for, recorded as it ran, followed transitively). With them their gaps and collector errors. Called
        before anything is read; returns the sections taken (a targeted check re-reads only what its
        wake-up concerns, agent/scope.py)."""
        known = set(prev._values) | set(prev._failed)
        stale = set(changed)
        grew = True
        while grew:  # a section built from a stale one is stale
            grew = False
            for sec in known - stale:
                if prev.deps.get(sec, set()) & stale:
                    stale.add(sec)
                    grew = True
        take = known - stale
        for sec in take:
            if sec in prev._values:
                self._values[sec] = prev._values[sec]
            else:
                self._failed[sec] = prev._failed[sec]
                if sec in prev._absent:
                    self._absent.add(sec)
                if prev._failed[sec].startswith(f"collector {sec} failed"):
                    self.errors.append(prev._failed[sec])
            if sec in prev.deps:
                self.deps[sec] = set(prev.deps[sec])
            for g in prev._gaps_of.get(sec, ()):
                if g in prev._gaps:
                    self._gaps.setdefault(g, prev._gaps[g])
                    self._gaps_of.setdefault(sec, []).append(g)
        self.reused = take
        return take

    def maybe(self, name: str) -> Any | None:
        """The section, or None when it is unavailable (for optional evidence)."""
        try:
            return self.get(name)
        except FactUnavailable:
            return None

    def set(self, name: str, value: Any) -> None:
        """Inject a section (the agent's history, tests)."""
        self._values[name] = value

    def read_text(self, path: str, max_bytes: int | None = None, unread: dict[str, str] | None = None) -> str | None:
        """Read through the root, recording a gap on failure (and why, by path, in `unread` when given)."""
        r = self.root.read_text(path, max_bytes) if max_bytes else self.root.read_text(path)
        if isinstance(r, Missing):
            if unread is not None:
                unread[path] = r.kind
            if r.kind != "missing":
                self.gap(r)
            return None
        return r
