"""The controller's options: one dataclass; flags are generated from it (`gpuwarden controller --help`).

Precedence: built-in default < environment (POD_NAMESPACE, POD_NAME) < flags. Values are coerced
and checked by the shared option layer (gpuwarden.options), as the agent's are: durations take
seconds (`90`) or units (`500ms`, `90s`, `30m`, `1h`, `1d`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from gpuwarden import options
from gpuwarden.options import ConfigError, check_schema, option as _opt
from gpuwarden.controller.dra import SLICE_STALE_S
from gpuwarden.remediation.breaker import DEFAULT_NAME as BREAKER_NAME

ACTIONS = ("workload", "taint", "node", "fences")
_DAY = 86400.0
#: ranges of the typed schema (options.check_schema): field -> (lowest, highest)
BOUNDS: dict[str, tuple[float, float]] = {
    "lease_duration_s": (1, 3600), "renew_deadline_s": (0.5, 3600), "retry_period_s": (0.1, 3600),
    "interval_s": (0.1, _DAY), "max_quarantines": (0, 1000), "quarantines_per_hour": (0, 1e6),
    "window_s": (1, 30 * _DAY), "cascade_nodes": (2, 100_000), "slack_s": (0, _DAY),
    "storm_window_s": (1, 30 * _DAY), "storm_nodes": (0, 1_000_000), "storm_fraction": (0, 1),
    "event_hold_s": (0, 30 * _DAY), "admission_failures": (1, 1_000_000), "admission_fraction": (0, 1),
    "admission_window_s": (1, _DAY),
    "fence_orphan_s": (60, 30 * _DAY), "slice_stale_s": (1, 30 * _DAY), "max_fence_deletes": (0, 10_000),
    "fence_deletes_per_hour": (0, 1e6),
}
LOG_FORMATS = ("json", "text")


@dataclass
class ControllerConfig:
    # --- cluster and identity ---------------------------------------------------------------------
    kubeconfig: str = _opt("", "kubeconfig file; empty: in-cluster service account when present, else ~/.kube/config.")
    context: str = _opt("", "kubeconfig context.")
    namespace: str = _opt("", "The controller's namespace: its Lease (env POD_NAMESPACE; else gpuwarden).", auto=True)
    identity: str = _opt("", "Leader-election identity (env POD_NAME; else host name + random suffix).", auto=True)
    node_selector: str = _opt("", "Label selector of the nodes to watch and taint (a GPU pool); empty: all. Of "
                                  "these, GPU nodes count (nvidia.com/gpu capacity, nvidia.com/gpu.present=true, or "
                                  "a gpuwarden condition).")
    # --- leader election --------------------------------------------------------------------------
    leader_elect: bool = _opt(True, "Take the Lease before acting (run two replicas; only the holder acts).")
    lease_name: str = _opt("gpuwarden-controller", "coordination.k8s.io/v1 Lease in --namespace.")
    lease_duration_s: float = _opt(15.0, "A Lease not renewed this long (as observed locally) may be taken over.",
                                   duration=True)
    renew_deadline_s: float = _opt(10.0, "The leader stops acting when it could not renew for this long.",
                                   duration=True)
    retry_period_s: float = _opt(2.0, "How often to try to take or renew the Lease.", duration=True)
    # --- loop -------------------------------------------------------------------------------------
    interval_s: float = _opt(10.0, "Reconcile at least this often (and soon after any watched change).", duration=True)
    watch: bool = _opt(True, "Watch Nodes, Pods and Events (off: list them at every reconcile).")
    once: bool = _opt(False, "Reconcile once (after taking the Lease) and exit.")
    # --- acting -----------------------------------------------------------------------------------
    execute: bool = _opt(False, "Act. Without it the controller is a dry run: Events and logs only, no change.")
    actions: list = _opt(["workload", "node"], "On a cascade: workload (scale a Deployment/StatefulSet/ReplicaSet "
                                               "to 0, suspend a Job/CronJob) and/or taint (taint the GPU pool "
                                               "NoSchedule); node: taint a node that fails every pod sent to it; "
                                               "fences: delete gpuwarden's orphaned DeviceTaintRules (--dra-driver).",
                         choices=ACTIONS)
    taint_key: str = _opt("gpuwarden.io/quarantine", "Key of the pool taint (value: cascade, effect NoSchedule).")
    max_quarantines: int = _opt(3, "Token bucket of quarantines: burst...")
    quarantines_per_hour: float = _opt(3.0, "...and refill; more cascades at once look like a storm, not a culprit.")
    open_breaker: bool = _opt(True, "In a storm, open the agents' circuit breaker ConfigMap.")
    agent_namespace: str = _opt("", "Namespace of the agents' breaker ConfigMap (default: --namespace).", auto=True)
    breaker_configmap: str = _opt(BREAKER_NAME, "The agents' circuit breaker ConfigMap.")
    # --- detection --------------------------------------------------------------------------------
    window_s: float = _opt(1800.0, "Cascade: all failures of the chain fall within this long.", duration=True)
    cascade_nodes: int = _opt(2, "Cascade: this many failed GPU nodes, in sequence, that held the workload's pods.")
    require_hop: bool = _opt(True, "Cascade: each later node's pod arrived after the previous node failed "
                                   "(the pod was moved there).")
    slack_s: float = _opt(30.0, "Clock-skew tolerance between timestamps of different components.", duration=True)
    storm_window_s: float = _opt(600.0, "Storm: GPU nodes that started failing within this long...", duration=True)
    storm_nodes: int = _opt(3, "...at least this many (0: no count threshold)...")
    storm_fraction: float = _opt(0.3, "...and at least this fraction of the GPU nodes (0: no fraction threshold).")
    admission_failures: int = _opt(10, "A node fails every pod: at least this many pods sent to it failed admission "
                                       "(UnexpectedAdmissionError, OutOf<resource>) or died at start...")
    admission_fraction: float = _opt(0.8, "...and they are at least this fraction of the pods sent to it...")
    admission_window_s: float = _opt(600.0, "...within this long.", duration=True)
    bad_conditions: list = _opt(["GPUUnchargedMemory", "GPUDriver"],
                                "gpuwarden NodeConditions that count as a node failure when True.")
    event_codes: list = _opt(["GPU-NODE", "GPU-DRV"], "Codes (prefixes) of gpuwarden Warning Events about a Node "
                                                      "that count as a node failure.")
    event_hold_s: float = _opt(600.0, "Such an Event counts for this long after it was last seen (or until its "
                                      "...Cleared Event).", duration=True)
    gpu_workloads_only: bool = _opt(True, "Only workloads whose pods request NVIDIA GPUs can be found culprits.")
    skip_namespaces: list = _opt(["kube-system"], "Workloads here are never quarantined (the controller's own "
                                                  "namespace is always skipped).")
    # --- DRA (docs/dra.md "The controller") ---------------------------------------------------------
    dra_driver: str = _opt("", "DRA driver (gpu.nvidia.com) whose ResourceSlices and gpuwarden's DeviceTaintRules "
                               "the controller watches; empty: none.")
    fence_orphan_s: float = _opt(1800.0, "A gpuwarden DeviceTaintRule whose node is deleted, or whose node's agent "
                                         "has not reported this long, is orphaned: reported, and deleted with "
                                         "--execute and --actions fences.", duration=True)
    slice_stale_s: float = _opt(SLICE_STALE_S, "Report ResourceSlices of a node that is deleted, or NotReady this long.",
                                duration=True)
    max_fence_deletes: int = _opt(10, "Token bucket of orphaned-fence deletions: burst...")
    fence_deletes_per_hour: float = _opt(60.0, "...and refill.")
    # --- serving and logging ----------------------------------------------------------------------
    listen: str = _opt("0.0.0.0:9466", "host:port of /metrics, /healthz, /readyz (empty: no server).")
    log_format: str = _opt("json", "Structured log lines on stderr: json or text.", choices=LOG_FORMATS)

    def resolved(self) -> "ControllerConfig":
        c = dataclasses.replace(self, actions=list(self.actions), bad_conditions=list(self.bad_conditions),
                                event_codes=list(self.event_codes), skip_namespaces=list(self.skip_namespaces))
        if not c.namespace:
            c.namespace = os.environ.get("POD_NAMESPACE", "") or "gpuwarden"
        if not c.identity:
            c.identity = os.environ.get("POD_NAME", "") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        if not c.agent_namespace:
            c.agent_namespace = c.namespace
        c.validate()
        return c

    def validate(self) -> None:
        check_schema(self, BOUNDS)  # types, ranges, and choices (actions, log_format)
        if self.cascade_nodes < 2:
            raise ConfigError("cascade_nodes must be >= 2 (one failed node is not a cascade)")
        if not 0 <= self.storm_fraction <= 1:
            raise ConfigError("storm_fraction must be within 0..1")
        if self.renew_deadline_s >= self.lease_duration_s:
            raise ConfigError("renew_deadline must be shorter than lease_duration")
        if min(self.interval_s, self.retry_period_s, self.window_s, self.storm_window_s) <= 0:
            raise ConfigError("interval, retry_period, window and storm_window must be positive")

    @property
    def skipped_namespaces(self) -> set[str]:
        return set(self.skip_namespaces) | {self.namespace}


FIELDS = {f.name: f for f in dataclasses.fields(ControllerConfig)}


def command_params() -> list:
    """The options of `gpuwarden controller` (click): one per field."""
    return options.click_params(ControllerConfig)


def from_flags(values: dict[str, Any]) -> ControllerConfig:
    """Flags over defaults (environment-dependent defaults: `resolved`); raises ConfigError on a bad value."""
    cfg = ControllerConfig()
    for name, v in options.given(values).items():
        if name in FIELDS:
            setattr(cfg, name, options.coerce(FIELDS[name], v, options.flag(FIELDS[name])))
    cfg.validate()
    return cfg


def parse_args(argv: Sequence[str]) -> ControllerConfig:
    """`gpuwarden controller ARGS` as a config; usage errors exit 2 as the command does."""
    return from_flags(options.parse(command_params(), argv, "gpuwarden controller"))
