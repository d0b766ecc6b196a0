"""The agent's check: rules + monitors -> debounce -> conditions, events, metrics -> remediation.

When checks run is agent/events.py's (the interval, and the event sources' wake-ups between: a wake-up's
check covers only the rules its topic concerns, agent/scope.py); the memory guard is agent/memguard.py's.

One check:
 1. `engine.run` over fresh `NodeFacts` of the root (a live root, /host in a pod, or a bundle/example).
 2. Monitors: device-plugin and pod-resources gRPC probes (live roots), then what only history
    shows: device-rule drift per container, uncharged memory growth, repeated probe timeouts.
 3. Per code an observation: bad (a finding), good (evaluated, nothing found), unknown (not
    evaluated). The debouncer raises after `debounce_raise` bad and clears after `debounce_clear`
    good; unknown never clears. During the boot grace period nothing is raised.
 4. NodeConditions (one per family), Events for raised/cleared codes, metrics.
 5. Remediation (off | dry-run | on) on findings present now whose code is raised.

Steady state on a quiet node (docs/performance.md): each check scans only what the logs gained
since the last one (one LogCursors for the agent's lifetime; the scans merge into whole-file
results, so log-based findings persist), and the API sees nothing but the conditions' heartbeat,
one GET and one PATCH every `heartbeat_s` (node-problem-detector's 5 minutes).
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, TextIO

from msgspec import Struct, field

from gpuwarden.agent import monitors as mon
from gpuwarden.agent.arenas import limit_arenas
from gpuwarden.agent.conditions import ConditionPublisher, Desired, fault_message
from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.history import Debouncer, NodeHistory, Obs
from gpuwarden.agent.latency import Latency
from gpuwarden.agent.memguard import memory_escape, note_separation
from gpuwarden.agent.metrics import AgentMetrics
from gpuwarden.agent.outbox import Outbox
from gpuwarden.agent.scope import Scope
from gpuwarden.agent.unsure import act as unsure_act
from gpuwarden.findings import Finding, Report, Severity, Status
from gpuwarden.kube.conditions import CONDITION_TYPES, code_from_reason, condition_type, healthy_reason, reason_for
from gpuwarden.kube.events import EventRecorder, ObjectRef, node_ref
from gpuwarden.kube.log import Log
from gpuwarden.memory.trend import MemoryHistory
from gpuwarden.parsers import proc_pid

OUTBOX_FILE = "outbox.json"
#: on the agent's Warning Event of a raised code: the strongest status of its findings
STATUS_ANNOTATION = "gpuwarden.io/status"
_RULE_FAILED = re.compile(r"^rule (\S+) failed")


def _confirmed(fs: list[Finding]) -> bool:
    return any(f.status == Status.CONFIRMED for f in fs)


class CheckResult(Struct):
    report: Report
    findings: list[Finding]
    observed: dict[str, Obs]
    transitions: dict[str, str]
    conditions: dict[str, bool]
    in_grace: bool
    duration_s: float
    plan: Any = None
    outcomes: list = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def node_uptime(facts: Any) -> float | None:
    """/proc/uptime, else facts.now - the `boot` fact (btime of /proc/stat)."""
    up = proc_pid.uptime(facts.read_text("/proc/uptime") or "")
    if up is not None:
        return up
    boot = facts.maybe("boot")
    return facts.now - boot if boot is not None else None


def _offline_kube() -> type:
    from gpuwarden.agent.offline import OfflineKube

    return OfflineKube


#: how long the DeviceTaintRule version found by discovery is trusted (an API server upgrade moves it)
DISCOVERY_TTL_S = 600.0


class StartError(RuntimeError):
    """The agent cannot start as configured (its --listen port is taken): it stops, exit 2, saying why."""


#: Agent.run's exit code when it could not start (the CLI's usage error)
EXIT_START_FAILED = 2


class Agent:
    def __init__(self, cfg: AgentConfig, kube: Any = None, root: Any = None, clock: Callable[[], float] = time.time,
                 out: TextIO | None = None, log: Log | None = None, registry: Any = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.out = out if out is not None else sys.stdout
        self.root = root if root is not None else self._open_root()
        self.mode = "live" if getattr(self.root, "live", False) else ("example" if cfg.example else "bundle")
        if not cfg.node_name:
            cfg.node_name = self._node_name()
        self.log = log or Log(cfg.log_format, node=cfg.node_name)
        self.history = NodeHistory(cfg.history_len)
        self.memory_history = MemoryHistory(max(cfg.history_len, 3), cfg.memory_growth_window_s,
                                            cfg.memory_growth_bytes_per_min, clock=self.clock)
        self._samples_warned = False
        self.debounce = Debouncer(cfg.debounce_raise, cfg.debounce_clear)
        self.metrics = AgentMetrics(registry)
        self.latency = Latency(self.metrics)
        if kube is None and cfg.kube:
            from gpuwarden.kube.client import Kube

            kube = Kube.from_config(cfg.kubeconfig, timeout_s=cfg.api_timeout_s)
        if not cfg.kube and cfg.example:
            # the demo: the real condition, Event and remediation code, its writes printed (agent/offline.py)
            from gpuwarden.agent.offline import OfflineKube, example_pods

            kube = OfflineKube(cfg.node_name, example_pods(self.root, cfg.node_name), self.out)
        self.kube = kube if (cfg.kube or isinstance(kube, _offline_kube())) else None
        state, state_root = self._state_file(OUTBOX_FILE)
        self.outbox = Outbox(state, log=self.log, root=state_root) if self.kube is not None else None
        self.recorder = (EventRecorder(self.kube, cfg.node_name, cfg.event_namespace, clock=clock, log=self.log,
                                       outbox=self.outbox, label_node=True)
                         if self.kube is not None and cfg.events else None)
        self.publisher = (ConditionPublisher(self.kube, cfg.node_name, cfg.heartbeat_s, self.outbox)
                          if self.kube is not None and cfg.conditions else None)
        self.declared = False  # our conditions were read from the Node (until then no False is sent)
        self._dropped_seen = 0
        self.executor = None
        #: our taint may be on the node: plan (and lift it) even when nothing is raised (read once at start)
        self._may_untaint = True
        self._taint_rule_version: tuple[str | None, float] | None = None  # (served version, when asked)
        from gpuwarden.remediation.guard import Cooldowns, TokenBucket

        self.local_cooldowns = Cooldowns(cfg.cooldown_s, clock)
        self.local_bucket = TokenBucket(cfg.rate_burst, cfg.rate_per_hour, clock)
        if self.kube is not None and cfg.remediate != "off":
            from gpuwarden.remediation.executor import Executor

            self.executor = Executor(self.kube, cfg, self.recorder, self.metrics, self.log, clock, self.out)
        from gpuwarden.logs.cursors import LogCursors

        #: where each log's scan stopped: every check reads only what a log gained since the last
        self.log_cursors = LogCursors()
        self.last_findings: dict[str, list[Finding]] = {}
        self._warned: dict[str, str] = {}  # raised code -> status its Warning Event said (at-risk, confirmed)
        self.families: dict[str, str] = {}
        self.preset_types: dict[str, tuple[str, str]] = {}  # condition type -> (reason, message) carried over
        self._pods_cache: list[dict] | None = None  # this check's list of the node's pods (_node_pods)
        #: the last check's facts: a targeted check takes from them what its wake-up does not concern
        self._facts: Any = None
        self.ready = False
        self.checks = 0
        self.last_start = 0.0
        self.last_ok = 0.0
        self._stop = threading.Event()
        self.server = None
        self._gc_frozen = False  # run(): what was alive after the first check is out of later collections
        #: run()'s event loop (agent/events.py); `sources` replaces the node's event sources (tests, the bench)
        self.loop: Any = None
        self._shown: dict[str, list[Finding]] = {}  # code -> findings on the findings gauge
        self.sources: list | None = None

    # -- setup -------------------------------------------------------------------------------------
    def _open_root(self) -> Any:
        if self.cfg.example:
            from gpuwarden.examples import open_example

            return open_example(self.cfg.example)
        from gpuwarden.root import HostRoot

        return HostRoot(self.cfg.root or "/")

    def _node_name(self) -> str:
        from gpuwarden.facts import NodeFacts

        ident = NodeFacts(self.root).maybe("identity") or {}
        return str(ident.get("hostname") or socket.gethostname())

    def start(self) -> None:
        """Serve HTTP, declare our conditions, carry over faults already raised, rebuild cooldowns.
        With the API away, declaring is tried again before each check's publish (`_declare`).
        A --listen that cannot be served is a StartError, before anything is written to the API."""
        if self.cfg.listen and self.server is None:
            from gpuwarden.status_server import StatusServer

            try:
                self.server = StatusServer(self.cfg.listen, self.status, self.metrics.exposition).start()
                self.log.info("serving", address=self.server.address)
            except OSError as exc:  # without /healthz the DaemonSet's probes would kill it later, and blind
                raise StartError(f"cannot serve /metrics, /healthz, /readyz on {self.cfg.listen}: "
                                 f"{exc.strerror or exc} (--listen: a free host:port, or empty for no server)") from None
        self._declare()
        if self.executor is not None:
            n = self.executor.rebuild_from_events()
            self.log.info("cooldowns-rebuilt", from_events=n)

    def _declare(self) -> bool:
        """Read our conditions from the Node once: a True one (or one a previous agent decided True and
        could not deliver) starts raised, and clears only after `debounce_clear` clean observations."""
        if self.publisher is None or self.declared:
            return self.declared
        try:
            now = self.clock()
            waiting = dict(self.outbox.conditions) if self.outbox is not None else {}
            existing = self.publisher.initial(now)
            cur = {c.get("type"): c for c in self.publisher.current()}
        except Exception as exc:
            self.log.error("conditions-init-failed", error=str(exc), retry="before the next check's publish")
            return False
        for t, is_true in existing.items():
            if not is_true or self._type_raised(t):
                continue
            c = waiting.get(t) or cur.get(t, {})
            code = code_from_reason(c.get("reason", ""))
            key = code or f"condition:{t}"
            self.debounce.preset(key, True, now)
            self.preset_types[t] = (c.get("reason", ""), c.get("message", ""))
            self.families.setdefault(key, "")
        self.declared = True
        self.log.info("conditions-declared", carried_over=sorted(self.preset_types))
        return True

    def _type_raised(self, t: str) -> bool:
        return any(self._type(k) == t for k in self.debounce.raised_keys())

    def status(self) -> dict:
        now = time.time()
        budget = 3 * self.cfg.interval_s + 4 * self.cfg.probe_timeout_s + 4 * self.cfg.grpc_timeout_s + 30
        alive = self.last_start == 0.0 or now - self.last_start < budget
        # readiness: a check completed, and the API server answered the latest request (kube on)
        api_down = self.kube is not None and getattr(self.kube, "reachable", None) is False
        why = ("cannot reach the API server: " + getattr(self.kube, "unreachable_why", "") if api_down
               else "" if self.ready else "no successful check yet")
        return {"ready": self.ready and not api_down, "alive": alive and not self._stop.is_set(),
                "detail": f"last check started {now - self.last_start:.0f}s ago" if self.last_start else "",
                "not_ready": why, "checks": self.checks}

    # -- one check ---------------------------------------------------------------------------------
    def check(self, scope: Scope | None = None) -> CheckResult:
        """One check: the full one (scope None: every rule and monitor), or the part a wake-up concerns
        (agent/scope.py), which observes only its rules, never clears (a clean observation of a raised code
        counts only in full checks: clearing stays as conservative as the interval), and acts only on what
        it raised or confirmed itself."""
        from gpuwarden import engine
        from gpuwarden.facts import NodeFacts, Settings
        from gpuwarden.rules import all_rules

        cfg = self.cfg
        t0 = time.perf_counter()
        self.last_start = time.time()
        now = self.clock()
        errors: list[str] = []
        self._pods_cache = None
        self.history.begin()
        live = bool(getattr(self.root, "live", False))
        settings = Settings(probes=cfg.probes and live, probe_timeout_s=cfg.probe_timeout_s,
                            probe_access=cfg.probe_access, kubelet_log=cfg.kubelet_log or None,
                            memory_history=self.memory_history, log_cursors=self.log_cursors,
                            admission_pods=self._node_pods if self.kube is not None else None)
        facts = NodeFacts(self.root, settings)
        # node rules only: the API-side verdicts (scope "api", GPU-K8S-020..022) are observed below
        rules = [r for r in engine.select(all_rules(), cfg.select, cfg.ignore) if r.scope == "node"]
        full = scope is None or scope.full
        if not full:
            changed = scope.sections(rules)  # type: ignore[union-attr]
            if self._facts is not None and changed is not None:  # what the wake-up does not concern: the last check's
                facts.inherit(self._facts, changed)
            rules = [r for r in rules if scope.wants_rule(r)]  # type: ignore[union-attr]
        wants = (lambda _name: True) if full else scope.wants_monitor  # type: ignore[union-attr]
        report = engine.run(facts, rules, mode=self.mode)
        self._facts = facts
        findings = list(report.findings)
        mem = facts.maybe("memory")  # this check's memory sample joins the agent's history here, in the open
        if mem is not None and mem.sample is not None and "memory" not in facts.reused:
            # a wake-up's sample replaces the latest one while that is a wake-up's too (within half an interval
            # of the one before): fast sampling follows a leak without pushing the interval's history out
            self.memory_history.add(mem.sample, coalesce_s=0.0 if full else cfg.interval_s / 2)
            if full:  # the file a one-shot `check` reads: once an interval, not at the fast sampling's pace
                self._save_samples()
        for r in rules:
            self.families[r.code] = r.family

        # observations from the rules
        skipped = {s.code for s in report.skipped}
        failed = {m.group(1) for e in report.errors if (m := _RULE_FAILED.match(e))}
        observed: dict[str, Obs] = {}
        bad = {f.code for f in findings if f.severity > Severity.INFO}  # information raises nothing
        for r in rules:
            observed[r.code] = "bad" if r.code in bad else "unknown" if (r.code in skipped or r.code in failed) else "good"

        # monitors
        res = mon.MonitorResult()
        if live and cfg.grpc and wants("grpc"):
            mon.kubelet_grpc(self.root, cfg.device_plugin_dir, cfg.pod_resources_socket, cfg.grpc_timeout_s,
                             self.history, self.metrics, now, res)
            errors.extend(res.errors)
        if live and cfg.probes and wants("repeated-timeouts"):  # a wake-up about a log line runs no NVML probe
            probes = facts.maybe("probes")
            n = getattr(probes, "nvml", None) if probes is not None else None
            if n is not None and "probes" not in facts.reused:  # an answer counts once, in the check that asked
                self.history.record_probe("nvml", now, n.status)
                self.metrics.probe("nvml", n.elapsed_s, n.status)
        # each monitor on its own: one monitor's bug must neither hide the rules' results nor skip the others
        monitors: list[tuple[str, Callable[[], Any]]] = [
            ("device-access", lambda: (self.metrics.set_access(mon.record_access(
                facts, self.history, res.allocations, res.registered, now)), mon.drift_findings(facts, self.history, res))),
            ("memory-growth", lambda: mon.memory_growth(facts, self.metrics)),
            ("repeated-timeouts", lambda: mon.repeated_timeouts(self.history, cfg.probe_timeout_repeat,
                                                                cfg.probe_timeout_window, res)),
        ]
        for name, run_monitor in monitors:
            if not wants(name):
                continue
            try:
                run_monitor()
            except Exception as exc:
                errors.append(f"monitor {name} failed: {type(exc).__name__}: {exc}")
                self.log.error("monitor-failed", monitor=name, error=f"{type(exc).__name__}: {exc}")
        self.history.prune()
        if cfg.dra_driver and self.kube is not None and hasattr(self.kube, "iter_items") and wants("dra-api"):
            self._dra_observe(facts, now, res, errors)
        for f in res.findings:
            mon.merge_into(findings, f)
            self.families.setdefault(f.code, f.family)
        for code, o in res.observed.items():
            cur = observed.get(code, "unknown")
            if o == "bad" or cur == "bad":
                observed[code] = "bad"
            elif o == "good" or cur == "good":
                observed[code] = "good"
            else:
                observed[code] = "unknown"
        for f in findings:
            if f.severity > Severity.INFO:
                observed[f.code] = "bad"
        # a condition carried over from a previous agent, under a reason we cannot map to a code
        for t in list(self.preset_types):
            key = f"condition:{t}"
            if key in self.debounce.states:
                obs = [o for c, o in observed.items() if self._type(c) == t]
                observed[key] = "bad" if "bad" in obs else "good" if "good" in obs else "unknown"

        # debounce (after reading our conditions from the Node, if the API was away at start: a fault a
        # previous agent raised starts raised before this check's observations count)
        declared = self._declare()
        in_grace = self._in_grace(facts)
        if not full:  # clearing stays the full checks' (as conservative as before wake-ups existed)
            observed = {c: "unknown" if o == "good" and self.debounce.raised(c) else o for c, o in observed.items()}
        self.latency.seen(observed, scope, now)
        transitions = self.debounce.observe_all(sorted(observed.items()), now, allow_raise=not in_grace)
        by_code: dict[str, list[Finding]] = {}
        for f in findings:
            by_code.setdefault(f.code, []).append(f)
        # what this check raised, or confirmed of what was raised at-risk: a targeted check acts on these only
        fresh = {c for c, tr in transitions.items() if tr == "raised"} | {
            c for c, fs in by_code.items() if self.debounce.raised(c) and _confirmed(fs)
            and not _confirmed(self.last_findings.get(c) or [])}
        for code, fs in by_code.items():
            self.last_findings[code] = fs
        for code, tr in transitions.items():
            if tr == "cleared":
                self.last_findings.pop(code, None)
                if code.startswith("condition:"):
                    self.preset_types.pop(code.split(":", 1)[1], None)

        # conditions, events, metrics
        conds = self._conditions()
        if self.publisher is not None:
            if declared:
                try:
                    self.publisher.publish(self._desired(conds), now)
                except Exception as exc:
                    errors.append(f"conditions: {exc}")
                    self.log.error("conditions-failed", error=str(exc))
            else:  # the Node was not read yet: keep the problems, send no False
                self.publisher.hold(self._desired(conds), now)
                errors.append("conditions: waiting for the API server")
        if self.recorder is not None:
            self.recorder.flush()
        self._events(transitions)
        if self.outbox is not None:
            self.metrics["gpuwarden_outbox_pending"].labels("event").set(len(self.outbox.events))
            self.metrics["gpuwarden_outbox_pending"].labels("condition").set(len(self.outbox.conditions))
            dropped = self.outbox.dropped - self._dropped_seen
            if dropped > 0:
                self.metrics["gpuwarden_outbox_dropped_total"].inc(dropped)
                self._dropped_seen = self.outbox.dropped
        for code, tr in transitions.items():
            self.log.info("fault-" + tr, code=code, condition=self._type(code),
                          summary=(self.last_findings.get(code) or [None])[0].summary if tr == "raised" else "")
        m = self.metrics
        # the findings gauge is the latest full check's, with the codes a targeted check observed replaced
        shown = {} if full else self._shown
        for code in observed if not full else ():
            shown.pop(code, None)
        for f in findings:
            shown.setdefault(f.code, []).append(f)
        self._shown = shown
        m.set_findings([f for fs in shown.values() for f in fs])
        m.set_raised({c: self.debounce.raised(c) for c in self.debounce.states if not c.startswith("condition:")})
        m.set_conditions(conds)
        if full:
            m["gpuwarden_rules_not_evaluated"].set(len(report.skipped))

        # remediation
        plan, outcomes = None, []
        acting = [f for f in findings if self.debounce.raised(f.code) and (full or f.code in fresh)] \
            if not in_grace else []
        note_separation(self, findings)
        guarded = [f for f in acting if memory_escape(f)]
        if guarded and cfg.remediate != "off":
            outcomes += self._memory_guard(guarded, errors)
        if cfg.memory_unsure_policy != "alert" and cfg.remediate != "off":  # agent/unsure.py
            outcomes += unsure_act(self, acting)
        rest = [f for f in acting if f not in guarded]
        # with nothing to act on, still plan while our taint may be on the node (it is lifted once its
        # fault has cleared: read the Node once after start, then only after we tainted it), and on a
        # DRA node (device fences also clear)
        if self.executor is not None and (rest or (full and (cfg.dra_driver or (
                self._may_untaint and not in_grace and cfg.node_fault_action == "taint")))):
            try:
                plan, more = self._remediate(rest)
                outcomes += more
            except Exception as exc:
                errors.append(f"remediation: {exc}")
                self.log.error("remediation-failed", error=str(exc))

        self.latency.raised(transitions, scope, now)
        self.latency.fenced(outcomes, self.clock())
        dur = time.perf_counter() - t0
        m["gpuwarden_check_duration_seconds"].observe(dur)
        m["gpuwarden_checks_total"].labels("ok").inc()
        if full:  # GpuwardenAgentNotChecking: the full check, not a wake-up's part of it
            m["gpuwarden_last_check_timestamp_seconds"].set(time.time())
        else:
            m["gpuwarden_targeted_checks_total"].labels(scope.label).inc()  # type: ignore[union-attr]
        self.checks += 1
        self.last_ok = time.time()
        self.ready = True
        return CheckResult(report, findings, observed, transitions, conds, in_grace, dur, plan, outcomes, errors)

    # -- pieces ------------------------------------------------------------------------------------
    def _type(self, code: str) -> str:
        if code.startswith("condition:"):
            return code.split(":", 1)[1]
        return condition_type(code, self.families.get(code, ""))

    def _in_grace(self, facts: Any) -> bool:
        """Within `boot_grace_s` of the node's boot: /proc/uptime, else facts.now - btime of /proc/stat.

        An example is a capture: its uptime is the captured node's, not a boot happening now.
        """
        if self.cfg.boot_grace_s <= 0 or self.mode == "example":
            return False
        uptime = node_uptime(facts)
        return uptime is not None and uptime < self.cfg.boot_grace_s

    def _conditions(self) -> dict[str, bool]:
        """Condition type -> problem present (a raised code whose findings' status sets conditions)."""
        out = {t: False for t in CONDITION_TYPES}
        statuses = set(self.cfg.condition_statuses)
        for key in self.debounce.raised_keys():
            t = self._type(key)
            if t not in out:
                continue
            fs = self.last_findings.get(key)
            if key.startswith("condition:") or fs is None or any(f.status.value in statuses for f in fs):
                out[t] = True
        return out

    def _desired(self, conds: dict[str, bool]) -> list[Desired]:
        out = []
        statuses = set(self.cfg.condition_statuses)
        for t, problem in conds.items():
            if not problem:
                out.append(Desired(t, False, healthy_reason(t), f"gpuwarden: no {t} problem found"))
                continue
            fs = [f for key in self.debounce.raised_keys() if self._type(key) == t
                  for f in self.last_findings.get(key, []) if f.status.value in statuses]
            if fs:
                reason, msg = fault_message(fs)
            else:
                reason, msg = self.preset_types.get(t, ("", ""))
                reason = reason or "GpuFault"
                msg = msg or "raised by a previous gpuwarden agent; not observed since"
            out.append(Desired(t, True, reason, msg))
        return out

    def _events(self, transitions: dict[str, str]) -> None:
        if self.recorder is None:
            return
        node = node_ref(self.cfg.node_name)
        for code, tr in sorted(transitions.items()):
            if code.startswith("condition:"):
                continue
            if tr == "raised":
                fs = self.last_findings.get(code, [])
                if not fs:
                    continue
                reason, msg = fault_message(fs)
                # the controller counts a node as failing on a confirmed fault only, never on an at-risk one
                # (one NVML timeout is gpuwarden's own deadline, not the node's failure: issue 32)
                status = "confirmed" if any(f.status == Status.CONFIRMED for f in fs) else fs[0].status.value
                self.recorder.emit(node, "Warning", reason, msg, annotations={STATUS_ANNOTATION: status})
                self._warned[code] = status
                for f in fs:
                    for a in f.affected:
                        if a.kind in ("container", "pod") and a.namespace and a.name:
                            pod = a.name.split("/", 1)[0]
                            # on the Node, the pod as `related`: an agent may write only Events about its own
                            # Node (the chart's policy; docs/security.md), a pod's node being unknowable to it
                            self.recorder.emit(node, "Warning", reason, f"{f.code} on pod {a.namespace}/{pod}: "
                                               f"{f.summary}", related=ObjectRef("Pod", pod, a.namespace, a.uid))
            else:
                self._warned.pop(code, None)
                self.recorder.emit(node, "Normal", reason_for(code) + "Cleared",
                                   f"{code}: not observed in {self.cfg.debounce_clear} consecutive checks")
        # a raised code whose findings became confirmed since its Warning said at-risk: say so once
        for code, status in list(self._warned.items()):
            fs = self.last_findings.get(code) or []
            if status == "at-risk" and code not in transitions and any(f.status == Status.CONFIRMED for f in fs):
                reason, msg = fault_message([f for f in fs if f.status == Status.CONFIRMED])
                self.recorder.emit(node, "Warning", reason, msg, annotations={STATUS_ANNOTATION: "confirmed"})
                self._warned[code] = "confirmed"

    def _remediate(self, acting: list[Finding]) -> tuple[Any, list]:
        from gpuwarden.remediation.plan import ClusterState, Options, build, is_plugin_pod

        cfg = self.cfg
        opts = Options(cfg.node_fault_action, cfg.taint_key, cfg.delete_unowned_pods, cfg.plugin_label_selector,
                       cfg.plugin_name_prefix)
        opts.device_taint_effect = cfg.device_taint_effect
        node = self.kube.get_node(cfg.node_name)
        pods = self._node_pods()
        state = ClusterState(node, pods, [p for p in pods if is_plugin_pod(p, opts)])
        if cfg.dra_driver:
            self._dra_state(state)
        # raised but not seen in this check (the debouncer has not cleared them): they keep their device fences
        holding = [f for code, fs in self.last_findings.items() if self.debounce.raised(code)
                   for f in fs if f not in acting]
        plan = build(acting, state, opts, self.executor.plugin_restarted_at(), holding)
        ours = any(t.get("key") == cfg.taint_key for t in (node.get("spec") or {}).get("taints") or [])
        if not acting and not plan.actions:
            self._may_untaint = ours
            return None, []
        by_code = {f.code: f for f in acting}
        outcomes = self.executor.execute(plan, cfg.remediate, by_code)
        if any(o.result == "done" for o in outcomes):
            self._pods_cache = None  # the pods changed: a later plan of this check reads them again
        self._may_untaint = ours or any(o.action.kind == "taint-node" and o.result == "done" for o in outcomes)
        return plan, outcomes

    def _node_pods(self) -> list[dict]:
        """This node's pods (`spec.nodeName` field-selected, paged), listed at most once a check: the pods
        the kubelet rejected at admission (facts/admissions.py, asked only while a GPU is lost), the DRA
        verdicts and the remediation plan read the same list; an action done makes the next reader list again."""
        if self._pods_cache is None:
            self._pods_cache = self.kube.list_pods(node_name=self.cfg.node_name)  # type: ignore[union-attr]
        return self._pods_cache

    def _state_file(self, name: str) -> tuple[str, Any]:
        """(path, root) of a file in `state_dir`: a node path under the live root when the directory lies
        on it (`/host/run/gpuwarden`), so it is written as every side effect on the node is; else a path
        of the agent's own filesystem. ("", None) without a state directory."""
        if not self.cfg.state_dir:
            return "", None
        path = os.path.join(os.path.abspath(self.cfg.state_dir), name)
        base = getattr(self.root, "base", None) if getattr(self.root, "live", False) else None
        if isinstance(base, str) and hasattr(self.root, "write_file"):
            rel = os.path.relpath(path, base)
            if rel != ".." and not rel.startswith("../"):
                return "/" + rel, self.root
        return path, None

    def _dra_observe(self, facts: Any, now: float, res: Any, errors: list[str]) -> None:
        """GPU-K8S-020..022: the node's ResourceSlices against its plugin sockets and GPUs (agent/dra.py)."""
        from gpuwarden.agent import dra

        try:
            pods = self._node_pods()
        except Exception as exc:
            pods = []
            errors.append(f"dra: pods: {exc}")
        got = dra.observe(self.kube, self.cfg.node_name, self.cfg.dra_driver, self.root, facts, pods, now)
        res.findings.extend(got.findings)
        for code, o in got.observed.items():
            res.observed[code] = o
            self.families.setdefault(code, "dra")
        errors.extend(got.errors)

    def _dra_state(self, state: Any) -> None:
        """The node's slices of the DRA driver and our DeviceTaintRules, for the device fence. A failed
        read leaves the state without DRA (no device fenced or unfenced this check; a node fault taints
        the node as before): it must never stop the rest of the plan, the memory guard's eviction above all."""
        from gpuwarden.kube import dra

        try:
            now = time.monotonic()
            if self._taint_rule_version is None or now - self._taint_rule_version[1] > DISCOVERY_TTL_S:
                self._taint_rule_version = (dra.taint_rule_version(self.kube), now)
            version = self._taint_rule_version[0]
            if version is None:
                return  # no DeviceTaintRule served: the node is fenced as before
            slices = dra.node_slices(self.kube, self.cfg.node_name, self.cfg.dra_driver)
            rules = dra.own_taint_rules(self.kube, self.cfg.node_name, version)
        except Exception as exc:
            self._taint_rule_version = None
            self.log.warn("dra-read-failed", error=str(exc))
            return
        state.dra, state.device_rules, state.taint_rule_version = slices, rules, version

    def _save_samples(self) -> None:
        """Keep the memory samples on the node (tmpfs) for a one-shot `check` there; live roots only.

        Written through the root (HostRoot.write_file): an exclusive temporary file in the directory
        resolved beneath the root, renamed over the file; a link planted there is replaced, not followed.
        """
        if not getattr(self.root, "live", False) or not self.cfg.memory_samples_file:
            return
        path = self.cfg.memory_samples_file
        try:
            self.root.write_file(path, json.dumps(self.memory_history.to_json()).encode())
        except OSError as exc:
            if not self._samples_warned:
                self._samples_warned = True
                self.log.warn("memory-samples-not-saved", path=path, root=getattr(self.root, "label", ""),
                              error=str(exc))

    def _memory_guard(self, escapes: list[Finding], errors: list[str]) -> list:
        """The memory guard, on its own (agent/memguard.py)."""
        from gpuwarden.agent.memguard import guard

        return guard(self, escapes, errors)

    def _last_resort(self, acting: list[Finding]) -> list:
        from gpuwarden.agent.memguard import last_resort

        return last_resort(self, acting)

    # -- the loop ----------------------------------------------------------------------------------
    def stop(self, *_: Any) -> None:
        self._stop.set()
        if self.loop is not None:
            self.loop.queue.wake_up()

    def run(self) -> int:
        limit_arenas()  # before the agent's first thread (agent/arenas.py)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        try:
            self.start()
        except StartError as exc:
            self.log.error("start-failed", error=str(exc))
            if self.kube is not None and hasattr(self.kube, "close"):
                self.kube.close()
            return EXIT_START_FAILED
        self.log.info("agent-started", root=getattr(self.root, "label", ""), interval_s=self.cfg.interval_s,
                      remediate=self.cfg.remediate,
                      kube="offline (example: writes printed, not sent)" if isinstance(self.kube, _offline_kube())
                      else self.kube is not None)
        from gpuwarden.agent.events import EventLoop

        self.loop = EventLoop(self, self.sources)
        try:
            self.loop.run(self._stop)
        finally:
            if self._gc_frozen:  # a run inside another program (tests, the bench) leaves nothing frozen
                gc.unfreeze()
                self._gc_frozen = False
            if self.server is not None:
                self.server.stop()
            if self.kube is not None and hasattr(self.kube, "close"):
                self.kube.close()
            self.log.info("agent-stopped", checks=self.checks)
        return 0

    def _collect(self) -> None:
        """A full garbage collection after each check; the first also freezes what is alive then (modules,
        rules, the agent's state), so the later ones look only at what checks made since: ~0.1 ms, not ~30 ms.

        Only a full collection empties CPython's free lists, and CPython starts one only when the objects
        that survived young collections reach a quarter of the long-lived ones (~30,000 after the imports),
        which a check's few survivors never did. Meanwhile the tuple free lists filled: `tuple(generator)`
        takes a 10-slot tuple and shrinks it, so each check left a few small tuples more on them, up to
        2,000 per size: RSS +40-45 KiB per 100 checks on a live root, level only after ~2,000 checks
        (docs/performance.md §9).
        """
        if not self._gc_frozen:
            gc.collect()
            gc.freeze()
            self._gc_frozen = True
        gc.collect()
