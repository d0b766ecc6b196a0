"""The agent's options: one dataclass, loaded from YAML and overridden by flags.

Precedence: built-in default < environment (only NODE_NAME, POD_NAMESPACE) < --config FILE < flags.
Every field is a YAML key (snake_case; kebab-case accepted) and a flag (`--kebab-case`); the
defaults printed by `gpuwarden agent --help` and listed in docs/agent.md come from here.
Durations accept seconds (`90`, `1.5`) or units (`500ms`, `90s`, `5m`, `1h`, `1d`, `1h30m`);
values are coerced and checked by the shared option layer (gpuwarden.options).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Sequence

from gpuwarden import options
from gpuwarden.options import ConfigError, check_schema, option as _opt

REMEDIATE_MODES = ("off", "dry-run", "on")
NODE_FAULT_ACTIONS = ("taint", "cordon", "none")
LOG_FORMATS = ("json", "text")


#: where `--example` serves /metrics when no --listen is set: loopback and a free port the kernel picks (the
#: "serving" line says which), so that a demo listens on no other interface and a second one starts too
EXAMPLE_LISTEN = "127.0.0.1:0"
#: the interval of `--example` when none is set: the demo raises (debounce_raise checks) and prints its plan
#: within seconds, where the node's 60 s would show nothing for two minutes
EXAMPLE_INTERVAL_S = 1.0

#: a config file is a few KB of YAML: anything larger (or not a regular file) is refused unread
MAX_CONFIG_BYTES = 1 << 20
_DAY = 86400.0

#: the typed schema's ranges: field -> (lowest, highest) allowed; every number must be finite too
BOUNDS: dict[str, tuple[float, float]] = {
    "interval_s": (0.01, 7 * _DAY),
    "cycles": (0, 1e9),
    "probe_timeout_s": (0.01, 3600),
    "debounce_raise": (1, 10_000),
    "debounce_clear": (1, 10_000),
    "boot_grace_s": (0, 7 * _DAY),
    "history_len": (1, 100_000),
    "confirm_delay_s": (0, 3600),
    "fast_memory_interval_s": (0, 3600),
    "probe_timeout_repeat": (1, 10_000),
    "probe_timeout_window": (1, 100_000),
    "memory_growth_bytes_per_min": (1, 1 << 60),
    "memory_growth_window_s": (1, 7 * _DAY),
    "memory_unsure_bound_s": (1, _DAY),
    "grpc_timeout_s": (0.01, 3600),
    "api_timeout_s": (0.05, 600),
    "heartbeat_s": (1, 7 * _DAY),
    "cooldown_s": (0, 365 * _DAY),
    "rate_burst": (1, 10_000),
    "rate_per_hour": (0, 1e6),
}


@dataclass
class AgentConfig:
    # --- where and what --------------------------------------------------------------------------
    node_name: str = _opt("", "Node this agent watches (env NODE_NAME; else the host name).", env="NODE_NAME",
                           auto=True)
    namespace: str = _opt("", "The agent's namespace: Events of its own, the breaker ConfigMap "
                              "(env POD_NAMESPACE; else gpuwarden).", env="POD_NAMESPACE", auto=True)
    root: str = _opt("", "Filesystem root of the node; empty: /host when running in a pod with the host "
                         "mounted there, else /.", auto=True)
    example: str = _opt("", "Watch a built-in example node instead of a live root (demo, tests).")
    interval_s: float = _opt(60.0, "Time between checks (with --example, 1s unless set: the demo shows its first "
                                   "plan within seconds).", duration=True)
    cycles: int = _opt(0, "Stop after this many checks (0: run until SIGTERM).")
    select: list = _opt([], "Only these rule codes or prefixes (repeatable).")
    ignore: list = _opt([], "Skip these rule codes or prefixes (repeatable).")
    probes: bool = _opt(True, "Live probes (NVML, cgroup v2 device programs) on a live root.")
    probe_timeout_s: float = _opt(5.0, "Hard deadline of each live probe.", duration=True)
    probe_access: bool = _opt(False, "Actively open() device nodes from inside each GPU container's cgroup.")
    kubelet_log: str = _opt("", "kubelet log file (klog text or journalctl -o json) for the kubelet rules.")
    # --- history and debounce ---------------------------------------------------------------------
    debounce_raise: int = _opt(2, "Consecutive observations of a fault before it is raised (condition, event, action).")
    debounce_clear: int = _opt(3, "Consecutive clean observations before a raised fault is cleared; "
                                  "a rule that cannot be evaluated never counts as clean.")
    boot_grace_s: float = _opt(300.0, "After node boot, observe but raise nothing and act on nothing.", duration=True)
    history_len: int = _opt(30, "Observations kept per container, GPU and probe.")
    probe_timeout_repeat: int = _opt(3, "This many probe timeouts within the last --probe-timeout-window checks, "
                                        "the latest included, confirm a hang (GPU-DRV-006 / GPU-K8S-001); one "
                                        "timeout is gpuwarden's own deadline missed: at-risk, never a fence.")
    probe_timeout_window: int = _opt(10, "Checks over which probe timeouts are counted.")
    memory_growth_bytes_per_min: int = _opt(1 << 30, "GPU-NODE-001 at-risk: uncharged memory growing faster "
                                                    "than this (bytes per minute) over --memory-growth-window.")
    memory_growth_window_s: float = _opt(300.0, "GPU-NODE-001 at-risk: how long the growth of "
                                                "--memory-growth-bytes-per-min must last.", duration=True)
    wake: bool = _opt(True, "Event sources wake the agent between checks (the kernel log, inotify on the kubelet's "
                            "plugin and DRA directories, CDI and /dev/nvidia*, memory pressure, MemAvailable "
                            "falling fast): a wake-up re-checks the rules it concerns within milliseconds. Off: "
                            "the periodic check only.")
    wake_nvml: bool = _opt(True, "With --wake and live probes: NVML events (Xid, ECC, GPU lost) from a killable "
                                 "child wake the agent (the gpu topic). Off: NVML is read by the periodic check only.")
    wake_pods: bool = _opt(True, "With --wake and an API client: a watch of this node's pods (field-selected) wakes "
                                 "the agent when the kubelet rejects one for a lost GPU (GPU-K8S-012). Needs the "
                                 "`watch` verb on pods. Off: pods are read by the periodic check only.")
    confirm_delay_s: float = _opt(0.2, "A fault seen for the first time is re-read this much later to confirm it "
                                       "(the debouncer's next observation), not at the next interval; 0: at the "
                                       "next check.", duration=True)
    fast_memory_interval_s: float = _opt(0.5, "While uncharged memory grows faster than --memory-growth-bytes-per-min, "
                                              "memory is re-read this often; 0: only at the interval.", duration=True)
    memory_samples_file: str = _opt("/run/gpuwarden/memory-samples.json", "Where on the node (under the root) the "
                                    "agent keeps its memory samples, so that a one-shot `check` there sees the "
                                    "growth and the arrivals it saw; empty: off.")
    # --- kubelet gRPC -----------------------------------------------------------------------------
    grpc: bool = _opt(True, "Probe the device plugin and the pod-resources API over gRPC (live roots).")
    grpc_timeout_s: float = _opt(3.0, "Deadline of each gRPC call.", duration=True)
    device_plugin_dir: str = _opt("/var/lib/kubelet/device-plugins", "Node path of the device-plugin sockets.")
    pod_resources_socket: str = _opt("/var/lib/kubelet/pod-resources/kubelet.sock",
                                     "Node path of the kubelet's pod-resources socket.")
    # --- Kubernetes -------------------------------------------------------------------------------
    kube: bool = _opt(True, "Report to the Kubernetes API (conditions, events, remediation).")
    kubeconfig: str = _opt("", "kubeconfig file; empty: in-cluster service account, else ~/.kube/config.")
    conditions: bool = _opt(True, "Maintain NodeConditions (one per family).")
    condition_statuses: list = _opt(["confirmed"], "Finding statuses that set a condition True "
                                                   "(confirmed, at-risk); others only get Events.")
    heartbeat_s: float = _opt(300.0, "Re-send unchanged conditions (lastHeartbeatTime) this often.", duration=True)
    events: bool = _opt(True, "Emit core/v1 Events for raised/cleared findings and for every action.")
    event_namespace: str = _opt("default", "Namespace of Events about the Node (kubelet's convention).")
    state_dir: str = _opt("", "Directory on the node (a hostPath) for the outbox of Events and condition "
                              "changes the API did not take yet; kept across restarts. Empty: in memory only.")
    api_timeout_s: float = _opt(10.0, "Deadline of each API call (one attempt; after a failure calls back off, "
                                      "jittered, up to 60 s).", duration=True)
    listen: str = _opt("0.0.0.0:9465", "host:port of /metrics, /healthz, /readyz (empty: no server).")
    # --- remediation ------------------------------------------------------------------------------
    remediate: str = _opt("off", "off | dry-run (print and log the plan, change nothing) | on (act). "
                                 "In YAML, `true` means dry-run.", choices=REMEDIATE_MODES)
    cooldown_s: float = _opt(900.0, "Never repeat an action on the same target within this long.", duration=True)
    rate_burst: int = _opt(3, "Token bucket per action kind: its burst (refilled at --rate-per-hour).")
    rate_per_hour: float = _opt(6.0, "Token bucket per action kind: its refill, actions per hour (burst: --rate-burst).")
    breaker_configmap: str = _opt("gpuwarden-breaker", "ConfigMap in the agent's namespace; data.open: \"true\" "
                                                       "stops every action, read fresh each check.")
    node_fault_action: str = _opt("taint", "For critical driver/hardware faults: taint (NoSchedule), cordon, "
                                           "or none.", choices=NODE_FAULT_ACTIONS)
    taint_key: str = _opt("gpuwarden.io/unhealthy", "Taint key; the value is the fault's family.")
    dra_driver: str = _opt("", "A DRA node's GPU driver (gpu.nvidia.com): read its ResourceSlices (field-selected by "
                               "this node) for GPU-K8S-020..022, and fence one bad GPU of several with a "
                               "DeviceTaintRule instead of tainting the node. Empty: no DRA API reads or writes.")
    device_taint_effect: str = _opt("NoSchedule", "Effect of a device fence: NoSchedule (new claims avoid the GPU) or "
                                                  "NoExecute (also evicts the pods using it).",
                                    choices=("NoSchedule", "NoExecute"))
    plugin_label_selector: str = _opt("app.kubernetes.io/name=nvidia-device-plugin",
                                      "Label selector of device-plugin pods.")
    plugin_name_prefix: str = _opt("nvidia-device-plugin", "Name prefix of device-plugin pods (when unlabelled).")
    delete_unowned_pods: bool = _opt(False, "Also delete GPU pods with no controller (nothing recreates them).")
    memory_local_kill: bool = _opt(False, "Memory guard's last resort: when the API server is unreachable, kill the "
                                          "processes of a pod CONFIRMED to have escaped its memory limit (GPU-NODE-001, "
                                          "high confidence) through its own cgroup (cgroup.kill).")
    memory_unsure_policy: str = _opt("alert", "When GPU-NODE-001 cannot separate the candidate holders and the node "
                                              "will reach its min watermark within --memory-unsure-bound while the "
                                              "growth goes on: alert (the finding only), stop-graphics-candidates "
                                              "(evict every graphics candidate, never a compute pod; killed through its "
                                              "cgroup with the API unreachable and --memory-local-kill), or "
                                              "fence-and-evict (taint the node, evict every candidate). docs/memory.md.",
                                     choices=("alert", "stop-graphics-candidates", "fence-and-evict"))
    memory_unsure_bound_s: float = _opt(300.0, "The projected time to the min watermark under which "
                                               "--memory-unsure-policy acts.", duration=True)
    # --- logging ----------------------------------------------------------------------------------
    log_format: str = _opt("json", "Structured log lines on stderr: json or text.", choices=LOG_FORMATS)

    # ---------------------------------------------------------------------------------------------
    def resolved(self) -> "AgentConfig":
        """Fill the environment-dependent defaults; validate."""
        c = dataclasses.replace(self)
        if not c.node_name:
            c.node_name = os.environ.get("NODE_NAME", "")
        if not c.namespace:
            c.namespace = os.environ.get("POD_NAMESPACE", "") or "gpuwarden"
        if not c.root and not c.example:
            in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
            c.root = "/host" if in_pod and os.path.isdir("/host/proc") else "/"
        c.validate()
        return c

    def validate(self) -> None:
        check_schema(self, BOUNDS)
        if self.example:
            from gpuwarden.examples import names

            if self.example not in names():
                raise ConfigError(f"example: no example node {self.example!r} (gpuwarden examples lists them)")
        if self.interval_s <= 0:
            raise ConfigError("interval_s must be positive")
        if self.debounce_raise < 1 or self.debounce_clear < 1:
            raise ConfigError("debounce_raise and debounce_clear must be >= 1")
        bad = [s for s in self.condition_statuses if s not in ("confirmed", "at-risk")]
        if bad:
            raise ConfigError(f"condition_statuses: unknown status {bad[0]!r} (confirmed, at-risk)")
        if self.select or self.ignore:
            _check_selection(self.select, self.ignore)

    @property
    def acting(self) -> bool:
        return self.remediate == "on"


def _check_selection(select: list[str], ignore: list[str]) -> None:
    """ConfigError when the selection runs no rule, or names a code no rule has: an agent that checks
    nothing must not start and report "findings: 0" (`check` exits 4 for the same selection)."""
    from gpuwarden import engine

    rules = engine.all_rules()
    for code in select:
        if not engine.select(rules, [code]):
            raise ConfigError(f"select: {code[:80]!r} matches no rule (gpuwarden rules lists them)")
    if not engine.select(rules, select, ignore):
        raise ConfigError("select/ignore: no rule is left to run (select "
                          f"{', '.join(select) or 'all'}; ignore {', '.join(ignore)[:200]})")


FIELDS = {f.name: f for f in dataclasses.fields(AgentConfig)}


def public_name(name: str) -> str:
    """The YAML key / flag stem of a field: durations drop their `_s` (they take units: 90s, 5m)."""
    return options.public_name(FIELDS[name])


#: every accepted YAML key (snake_case public names, plus the field names themselves) -> field
KEYS = {**{n: n for n in FIELDS}, **{public_name(n): n for n in FIELDS}}

def _coerce(name: str, value: Any) -> Any:
    if name == "remediate" and isinstance(value, bool):  # YAML `remediate: true` means dry-run
        return "dry-run" if value else "off"
    return options.coerce(FIELDS[name], value)


def from_mapping(doc: dict[str, Any], base: AgentConfig | None = None) -> AgentConfig:
    """Apply a YAML mapping over `base`; unknown keys are errors (a typo must not pass silently)."""
    cfg = dataclasses.replace(base) if base else AgentConfig()
    if not isinstance(doc, dict):
        raise ConfigError("the config file must be a mapping of option: value")
    for key, value in doc.items():
        name = KEYS.get(str(key).replace("-", "_"))
        if name is None:
            raise ConfigError(f"unknown option {key!r} (see gpuwarden agent --help)")
        setattr(cfg, name, _coerce(name, value))
    return cfg


#: no option is deeper than a list; anything nested past this is not a config
MAX_NESTING = 32


def load_file(path: str, base: AgentConfig | None = None) -> AgentConfig:
    """A YAML config file over `base`, read with the bounded reader: never blocks on a FIFO, never reads past 1 MiB."""
    return from_mapping(read_file(path), base)


def read_file(path: str) -> Any:
    """The YAML document of a config file, read with the bounded reader (never blocks on a FIFO, never
    reads past 1 MiB) and loaded with the bounded safe loader (aliases, nodes and nesting:
    gpuwarden.safeyaml); ConfigError when it is none."""
    from gpuwarden import safeyaml

    from gpuwarden.root import read_regular

    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 10} KiB; not a config file") from None
    try:
        doc = safeyaml.load(raw, max_depth=MAX_NESTING) or {}  # bytes: YAML's own encoding detection
    except safeyaml.YamlError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from None
    return doc


def command_params() -> list:
    """The options of `gpuwarden agent` (click): --config, --dry-run, --print-config, and one per field."""
    import click

    return [click.Option(["--config", "config_file"], metavar="FILE",
                         help="YAML file of options (the keys below, snake_case); flags override it."),
            click.Option(["--dry-run"], is_flag=True, default=False, help="Shorthand for --remediate dry-run."),
            click.Option(["--print-config"], is_flag=True, default=False,
                         help="Print the effective configuration as YAML and exit."),
            *options.click_params(AgentConfig)]


def from_flags(values: dict[str, Any]) -> AgentConfig:
    """Defaults < --config FILE < flags (environment-dependent defaults: `resolved`). Raises ConfigError."""
    flags = options.given(values)
    cfg = AgentConfig()
    interval_set, listen_set = "interval_s" in flags, "listen" in flags
    if flags.get("config_file"):
        doc = read_file(flags["config_file"])
        cfg = from_mapping(doc, cfg)
        interval_set = interval_set or any(KEYS.get(str(k).replace("-", "_")) == "interval_s" for k in doc)
        listen_set = listen_set or any(KEYS.get(str(k).replace("-", "_")) == "listen" for k in doc)
    for name in FIELDS:
        if name not in flags:
            continue
        setattr(cfg, name, _coerce(name, flags[name]))
    if flags.get("dry_run"):
        cfg.remediate = "dry-run"
    if cfg.example and not interval_set:  # the demo: its plan in seconds, not minutes
        cfg.interval_s = EXAMPLE_INTERVAL_S
    if cfg.example and not listen_set:  # the demo: this machine only, on a port no other demo holds
        cfg.listen = EXAMPLE_LISTEN
    cfg.validate()
    return cfg


def parse_args(argv: Sequence[str]) -> tuple[AgentConfig, dict[str, Any]]:
    """`gpuwarden agent ARGS` as (config, the flag values); usage errors exit 2 as the command does."""
    values = options.parse(command_params(), argv, "gpuwarden agent")
    return from_flags(values), values


def to_mapping(cfg: AgentConfig) -> dict[str, Any]:
    """The config under its public keys (what --config accepts)."""
    return {public_name(n): getattr(cfg, n) for n in FIELDS}


def to_yaml(cfg: AgentConfig) -> str:
    import yaml

    return yaml.safe_dump(to_mapping(cfg), sort_keys=False)
