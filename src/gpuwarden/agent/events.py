"""The agent's loop: sources -> a coalescing queue -> targeted checks -> decisions -> actions.

The full check still runs every `interval` (the safety net, and the only check that clears). Between
two, the event sources (gpuwarden.wake) wake the loop: everything pending is taken at once and becomes
one check of the rules those topics concern (agent/scope.py). A code seen bad for the first time is
re-read `confirm_delay` later (a confirming read of the same rules), never left for the next interval:
what needed two 60 s checks needs two reads a fraction of a second apart. While uncharged memory grows
faster than the growth threshold, memory is re-read every `fast_memory_interval` until it stops.

Nothing wakes the loop on a healthy node: the sources are silent, no timer but the interval is set.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from gpuwarden.agent.scope import Scope
from gpuwarden.wake.queue import Pending, WakeQueue


#: the least time between the end of a wake-up's check and the start of the next one
RECHECK_GAP_S = 0.2


def default_sources(agent: Any) -> list:
    """The sources of this root: the kernel log (its device on a live node, else its files), the watched
    directories, memory pressure and MemAvailable falling fast; NVML events where live probes are on (a live root), the node's pods
    watch where there is an API client. Each can be switched off (--no-wake-nvml, --no-wake-pods).
    Unavailable ones say why at start and are left out."""
    from gpuwarden.wake.meminfo import MemDropSource
    from gpuwarden.wake.psi import PsiSource
    from gpuwarden.wake.watch import WatchSource

    cfg = agent.cfg
    kubelet_root = cfg.device_plugin_dir.rstrip("/").rsplit("/", 1)[0] or "/var/lib/kubelet"
    out: list = [KernelLog(agent.root), WatchSource(agent.root, kubelet_root=kubelet_root), PsiSource(agent.root),
                 MemDropSource(agent.root, growth_bytes_per_min=cfg.memory_growth_bytes_per_min)]
    if cfg.wake_nvml and cfg.probes and getattr(agent.root, "live", False):
        from gpuwarden.wake.nvml import NvmlEvents

        out.append(NvmlEvents(agent.root, init_timeout_s=cfg.probe_timeout_s, log=agent.log))
    if cfg.wake_pods and agent.kube is not None and hasattr(agent.kube, "watch") and not _offline(agent.kube):
        from gpuwarden.wake.pods import PodsWatch

        out.append(PodsWatch(agent.kube, cfg.node_name, log=agent.log))
    return out


def _offline(kube: Any) -> bool:
    """The demo's API stand-in (agent/offline.py): its writes are printed, it has no watch to follow."""
    from gpuwarden.agent.offline import OfflineKube

    return isinstance(kube, OfflineKube)


class KernelLog:
    """/dev/kmsg where it is the kernel's device, else the captured log files (a node tree)."""

    name = "kernel-log"

    def __init__(self, root: Any) -> None:
        from gpuwarden.wake.kmsg import KmsgSource
        from gpuwarden.wake.logfile import LogFileSource

        self.choices = [KmsgSource(root), LogFileSource(root)]
        self.chosen: Any = None
        self.why = ""

    def start(self, emit: Any) -> str | None:
        whys = []
        for s in self.choices:
            why = s.start(emit)
            if why is None:
                self.chosen, self.name = s, s.name
                return None
            whys.append(f"{s.name}: {why}")
        self.why = "; ".join(whys)
        return self.why

    @property
    def failed(self) -> str:
        return getattr(self.chosen, "failed", "") if self.chosen is not None else ""

    def stop(self) -> None:
        if self.chosen is not None:
            self.chosen.stop()


class EventLoop:
    def __init__(self, agent: Any, sources: list | None = None, monotonic: Any = time.monotonic) -> None:
        self.agent = agent
        self.cfg = agent.cfg
        self.queue = WakeQueue()
        self.sources = sources
        self.running: list[Any] = []
        self.starting: list[threading.Thread] = []  # sources whose start blocks (NVML), started aside
        self._lock = threading.Lock()
        self._stopping = False
        self.monotonic = monotonic
        self.confirm: tuple[float, Scope] | None = None  # (when, what) of the pending confirming read
        self.fast_at: float | None = None  # the next fast memory read
        self._mem_last: tuple[float, int] | None = None  # (t, gap) of the latest memory sample seen
        self._failed_said: set[str] = set()
        self.not_before = 0.0  # no wake-up's check before this (monotonic)
        self.checks = 0  # full checks run
        self.targeted = 0

    # -- sources ---------------------------------------------------------------------------------
    def start(self) -> None:
        why = ("--no-wake" if not self.cfg.wake else "" if self.sources is not None or hasattr(self.agent.root, "open_dir")
               else "a built-in example does not change")
        if why:
            self.agent.log.info("wake-sources-off", why=why, fallback=f"the periodic check every {self.cfg.interval_s:g}s")
            return
        sources = self.sources if self.sources is not None else default_sources(self.agent)
        for s in sources:
            if getattr(s, "slow_start", False):  # its start may block seconds (nvmlInit): the first check goes on
                t = threading.Thread(target=self._start_one, args=(s,), name=f"wake-start-{s.name}", daemon=True)
                self.starting.append(t)
                t.start()
            else:
                self._start_one(s)

    def _start_one(self, s: Any) -> None:
        try:
            why = s.start(self._emit)
        except Exception as exc:  # a source's bug is a source unavailable, never an agent down
            why = f"{type(exc).__name__}: {exc}"
        gauge = self.agent.metrics["gpuwarden_wake_source_up"]
        with self._lock:
            if why is None and self._stopping:  # the loop stopped while this one was starting
                s.stop()
                return
            if why is None:
                self.running.append(s)
                gauge.labels(s.name).set(1)
                self.agent.log.info("wake-source-started", source=s.name)
            else:
                gauge.labels(s.name).set(0)
                self.agent.log.warn("wake-source-unavailable", source=s.name, why=why,
                                    fallback=f"the periodic check every {self.cfg.interval_s:g}s")
        self.queue.wake_up()  # a loop waiting without sources now takes their wakes

    @property
    def _listening(self) -> bool:
        return bool(self.running) or any(t.is_alive() for t in self.starting)

    def _emit(self, wake: Any) -> None:
        self.agent.metrics["gpuwarden_wakeups_total"].labels(wake.source, wake.topic).inc()
        self.queue.put(wake)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            running, self.running = list(self.running), []
        for s in running:
            try:
                s.stop()
            except Exception as exc:
                self.agent.log.warn("wake-source-stop-failed", source=s.name, error=str(exc))
        self.queue.wake_up()

    def _watch_sources(self) -> None:
        """A source that died since says so once (log line, metric); the periodic check covers it."""
        for s in self.running:
            why = getattr(s, "failed", "")
            if why and s.name not in self._failed_said:
                self._failed_said.add(s.name)
                self.agent.metrics["gpuwarden_wake_source_up"].labels(s.name).set(0)
                self.agent.log.warn("wake-source-failed", source=s.name, why=why,
                                    fallback=f"the periodic check every {self.cfg.interval_s:g}s")

    # -- the loop --------------------------------------------------------------------------------
    def run(self, stopped: Any) -> None:
        """Until `stopped` (a threading.Event) is set or `cycles` full checks ran."""
        self.start()
        try:
            next_full = self.monotonic()
            while not stopped.is_set():
                now = self.monotonic()
                if now >= next_full:
                    t0 = now
                    self._check(None)
                    self.checks += 1
                    if self.cfg.cycles and self.checks >= self.cfg.cycles and self.confirm is None:
                        break
                    next_full = t0 + self.cfg.interval_s
                    self._watch_sources()
                    continue
                if self.confirm is not None and now >= self.confirm[0]:
                    scope, self.confirm = self.confirm[1], None
                    self._check(scope)
                    if self.cfg.cycles and self.checks >= self.cfg.cycles and self.confirm is None:
                        break
                    continue
                if self.fast_at is not None and now >= self.fast_at:
                    self.fast_at = None
                    self._check(Scope(frozenset({"memory"}), "fast-memory", time.time()))
                    continue
                due = min(t for t in (next_full, self.confirm[0] if self.confirm else None, self.fast_at)
                          if t is not None)
                if now < self.not_before:  # a storm: what it changes meanwhile waits in the queue, folded
                    stopped.wait(max(0.0, min(due, self.not_before) - now))
                    continue
                listening = self._listening
                batch = self.queue.take(max(0.0, due - now)) if listening else {}
                if not listening:
                    stopped.wait(max(0.0, due - now))
                if stopped.is_set():
                    break
                if batch:
                    self._check(self._scope(batch))
        finally:
            self.stop()

    @staticmethod
    def _scope(batch: dict[str, Pending]) -> Scope | None:
        """One check for the whole batch: its topics, from the earliest wake (the latency's start).
        An inotify overflow ("all") asks for the full check."""
        first = min((p.first for p in batch.values()), key=lambda w: w.seen)
        if "all" in batch:
            return Scope(frozenset(), first.source, first.seen, frozenset({"*"}))
        return Scope(frozenset(batch), first.source, first.seen)

    def _check(self, scope: Scope | None) -> None:
        a = self.agent
        if scope is not None and "*" in scope.confirm:
            scope = None  # events were lost: everything is read
        try:
            r = a.check() if scope is None else a.check(scope)
        except Exception as exc:  # the loop must survive anything one check does
            a.metrics["gpuwarden_checks_total"].labels("error").inc()
            a.log.error("check-failed", error=f"{type(exc).__name__}: {exc}")
            a._collect()
            return
        if scope is None:
            a.log.info("check", n=a.checks, findings=len(r.findings), raised=a.debounce.raised_keys(),
                       grace=r.in_grace, duration_s=round(r.duration_s, 3))
        else:
            self.targeted += 1
            # the next wake-up's check waits a little after a targeted one (0.2 s, or as long as the check took):
            # a storm costs at most half a core, a short check's storm a fifth; the first wake-up of a quiet
            # spell is still checked at once
            self.not_before = self.monotonic() + max(RECHECK_GAP_S, r.duration_s)
            a.log.info("check", n=a.checks, scope=scope.label, source=scope.source,
                       confirming=sorted(scope.confirm) or None, findings=len(r.findings),
                       raised=a.debounce.raised_keys(), transitions=r.transitions or None,
                       duration_s=round(r.duration_s, 3))
        a._collect()
        self._after(r, scope)

    def _after(self, r: Any, scope: Scope | None) -> None:
        """Schedule the confirming read of codes seen bad and not yet raised, and the fast memory read."""
        a, now = self.agent, self.monotonic()
        if not r.in_grace and self.cfg.confirm_delay_s > 0:
            states = a.debounce.states
            pending = self.confirm[1].confirm if self.confirm else frozenset()
            bad = frozenset(c for c, o in r.observed.items() if o == "bad")
            # still to confirm: bad now or pending and not seen since, not raised, their streak started
            todo = frozenset(c for c in bad | (pending - frozenset(r.observed)) if not a.debounce.raised(c)
                             and c in states and 0 < states[c].bad < a.debounce.raise_after)
            if not todo:
                self.confirm = None
            elif todo - pending or self.confirm is None:  # a new code: its read comes a moment after this one
                topics = (scope.topics if scope is not None else frozenset()) | (
                    self.confirm[1].topics if self.confirm else frozenset())
                src, seen = (scope.source, scope.seen) if scope is not None else ("periodic", time.time())
                when = self.confirm[0] if self.confirm else now + self.cfg.confirm_delay_s
                self.confirm = (min(when, now + self.cfg.confirm_delay_s), Scope(topics, src, seen, todo))
        s = a.memory_history.samples
        if self.cfg.fast_memory_interval_s > 0 and s:
            last = (s[-1].t, s[-1].gap)
            if self._mem_last is not None and last[0] > self._mem_last[0]:
                rate = (last[1] - self._mem_last[1]) / (last[0] - self._mem_last[0])  # bytes/s
                growing = rate * 60 >= self.cfg.memory_growth_bytes_per_min
                if growing and self.fast_at is None:
                    self.fast_at = now + self.cfg.fast_memory_interval_s
                    if not getattr(self, "_fast", False):
                        a.log.info("memory-fast-sampling", rate_bytes_per_s=int(rate),
                                   every_s=self.cfg.fast_memory_interval_s)
                self._fast = growing
            if scope is not None and scope.source == "meminfo" and self.fast_at is None:
                # MemAvailable fell fast: the next read comes at the fast pace too, so the rate between two
                # reads a moment apart (not against the last periodic one, up to an interval old) decides
                self.fast_at = now + self.cfg.fast_memory_interval_s
            self._mem_last = last
