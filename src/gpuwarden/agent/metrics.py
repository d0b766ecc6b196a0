"""Prometheus metrics of the agent (prometheus-client, a registry of its own).

Names follow the Prometheus conventions: `gpuwarden_` prefix, base units (`_seconds`, `_bytes`),
counters end in `_total`. docs/agent.md lists every metric; tests/agent/test_metrics.py checks
the list against this module.
"""

from __future__ import annotations

from typing import Any, Iterable

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: fault latency: the issue's targets (0.5 s, 2 s, 3 s) are bucket edges, and the periodic path's minutes fit too
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120, 300)

#: name -> (type, help, labels); the single source of the documented list
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gpuwarden_findings": ("gauge", "Findings of the latest check (before debounce), by code, severity, status, family "
                                    "and GPU (its index; \"\" for a finding that names no GPU).",
                           ("code", "severity", "status", "family", "gpu")),
    "gpuwarden_fault_raised": ("gauge", "1 while a finding code is raised (after debounce), else 0.", ("code",)),
    "gpuwarden_node_condition": ("gauge", "1 while our NodeCondition of this type is True (problem present).", ("type",)),
    "gpuwarden_check_duration_seconds": ("histogram", "Wall time of one check (rules, probes, monitors).", ()),
    "gpuwarden_probe_duration_seconds": ("histogram", "Wall time of one probe call (gRPC RPC, NVML).", ("probe",)),
    "gpuwarden_probe_timeouts_total": ("counter", "Probe calls that hit their deadline.", ("probe",)),
    "gpuwarden_uncharged_memory_bytes": ("gauge", "Host memory no memory cgroup is charged for (the memory ledger's gap).", ()),
    "gpuwarden_uncharged_memory_growth_bytes_per_second": ("gauge", "Slope of gpuwarden_uncharged_memory_bytes over the growth window.", ()),
    "gpuwarden_container_device_access": ("gauge", "1 when a GPU container's device policy allows the device node, 0 when it denies it.",
                                          ("namespace", "pod", "container", "device")),
    "gpuwarden_gpu_allocation": ("gauge", "1 per (GPU device id, container) from the kubelet's pod-resources API.",
                                 ("resource", "device_id", "namespace", "pod", "container")),
    "gpuwarden_plugin_devices": ("gauge", "Healthy devices the kubelet registered per resource (its device-manager checkpoint's RegisteredDevices).", ("resource",)),
    "gpuwarden_remediation_actions_total": ("counter", "Planned remediation actions by kind and result (done, failed, dry-run, "
                                                       "breaker-open, cooldown, rate-limited).", ("action", "result", "dry_run")),
    "gpuwarden_checks_total": ("counter", "Checks run, by result (ok, error).", ("result",)),
    "gpuwarden_last_check_timestamp_seconds": ("gauge", "End of the latest successful check (epoch seconds).", ()),
    "gpuwarden_rules_not_evaluated": ("gauge", "Rules skipped in the latest check because their evidence is unavailable.", ()),
    "gpuwarden_outbox_pending": ("gauge", "Events and condition changes waiting for the API server (the outbox).", ("kind",)),
    "gpuwarden_outbox_dropped_total": ("counter", "Events dropped because the outbox was full (oldest Normal first).", ()),
    "gpuwarden_fault_seen_to_raised_seconds": ("histogram", "From the first bad observation of a code (the time its wake-up "
                                               "was seen by the source; a periodic check's start) to its raise.",
                                               ("source", "topic")),
    "gpuwarden_raised_to_fenced_seconds": ("histogram", "From a code's raise to its fence done (node taint or cordon, "
                                           "DeviceTaintRule).", ("source", "topic")),
    "gpuwarden_wakeups_total": ("counter", "Wake-ups the event sources emitted, by source and topic (before coalescing).",
                                ("source", "topic")),
    "gpuwarden_targeted_checks_total": ("counter", "Checks of only the rules a wake-up concerns, by topics.", ("topics",)),
    "gpuwarden_wake_source_up": ("gauge", "1 while an event source runs; 0 when it is unavailable here or failed "
                                          "(the periodic check covers what it would have seen).", ("source",)),
}


class AgentMetrics:
    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        self._m: dict[str, Any] = {}
        for name, (kind, help_text, labels) in METRICS.items():
            if kind == "gauge":
                m = Gauge(name, help_text, labels, registry=self.registry)
            elif kind == "counter":
                m = Counter(name.removesuffix("_total"), help_text, labels, registry=self.registry)
            else:
                buckets = _LATENCY_BUCKETS if name.endswith(("_to_raised_seconds", "_to_fenced_seconds")) else _DURATION_BUCKETS
                m = Histogram(name, help_text, labels, buckets=buckets, registry=self.registry)
            self._m[name] = m

    def __getitem__(self, name: str) -> Any:
        return self._m[name]

    # -- helpers -----------------------------------------------------------------------------------
    def set_findings(self, findings: Iterable[Any]) -> None:
        g = self._m["gpuwarden_findings"]
        g.clear()
        for f in findings:
            gpus = f.gpus() if hasattr(f, "gpus") else []
            for gpu in [str(a.index) if a.index is not None else (a.uuid or a.name) for a in gpus] or [""]:
                g.labels(f.code, f.severity.label, f.status.value, f.family or "", gpu).inc()

    def set_raised(self, codes_state: dict[str, bool]) -> None:
        g = self._m["gpuwarden_fault_raised"]
        for code, raised in codes_state.items():
            g.labels(code).set(1 if raised else 0)

    def set_conditions(self, state: dict[str, bool]) -> None:
        g = self._m["gpuwarden_node_condition"]
        for t, v in state.items():
            g.labels(t).set(1 if v else 0)

    def set_access(self, rows: Iterable[tuple[str, str, str, str, bool]]) -> None:
        g = self._m["gpuwarden_container_device_access"]
        g.clear()
        for ns, pod, ctr, dev, allowed in rows:
            g.labels(ns, pod, ctr, dev).set(1 if allowed else 0)

    def set_allocations(self, rows: Iterable[Any]) -> None:
        g = self._m["gpuwarden_gpu_allocation"]
        g.clear()
        for r in rows:
            for d in r.device_ids:
                g.labels(r.resource, d, r.namespace, r.pod, r.container).set(1)

    def set_plugin_devices(self, registered: dict[str, tuple[str, ...]]) -> None:
        """Read from the kubelet's checkpoint, never from the plugin's ListAndWatch (docs/security.md)."""
        g = self._m["gpuwarden_plugin_devices"]
        g.clear()
        for resource, ids in registered.items():
            g.labels(resource).set(len(ids))

    def probe(self, name: str, elapsed_s: float, status: str) -> None:
        self._m["gpuwarden_probe_duration_seconds"].labels(name).observe(max(0.0, elapsed_s))
        if status == "timeout":
            self._m["gpuwarden_probe_timeouts_total"].labels(name).inc()

    def action(self, action: str, result: str, dry_run: bool) -> None:
        self._m["gpuwarden_remediation_actions_total"].labels(action, result, "true" if dry_run else "false").inc()

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
