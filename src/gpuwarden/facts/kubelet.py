"""Kubelet: its flags and config, the CPU manager state, the device manager checkpoint."""

from __future__ import annotations

import json
from typing import Any

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import kubelet_checkpoint, kubelet_flags, plausible
from gpuwarden.root import Missing

DEFAULT_ROOT_DIR = "/var/lib/kubelet"
DEFAULT_CONFIG = "/var/lib/kubelet/config.yaml"


class KubeletFacts(Struct):
    """The running kubelet: its flags, config file and CPU manager policy."""
    pid: int | None
    argv: list[str]
    flags: dict[str, str]
    config_path: str | None
    config: dict[str, Any]
    root_dir: str
    cpu_manager_policy: str
    cpu_manager_policy_source: str
    cgroup_driver: str
    cgroup_driver_source: str
    feature_gates: dict[str, bool]
    verbosity: int | None
    cpu_manager_state: dict[str, Any] | None
    checkpoint: kubelet_checkpoint.Checkpoint | None
    checkpoint_path: str
    plugin_sockets: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)


def _load_yaml(text: str) -> dict[str, Any] | None:
    from gpuwarden import safeyaml  # bounded: a node's file may be an alias bomb or a bad scalar

    try:
        doc = safeyaml.load(text)
    except safeyaml.YamlError:
        return None
    return doc if isinstance(doc, dict) else None


def _pick(flags: dict[str, str], flag: str, config: dict[str, Any], key: str, default: str,
          config_path: str | None) -> tuple[str, str]:
    if flag in flags:
        return flags[flag], f"kubelet flag --{flag}={flags[flag]}"
    if key in config:
        return str(config[key]), f"{config_path}: {key}: {config[key]}"
    return default, f"kubelet default ({key} not set)"


@fact("kubelet")
def collect_kubelet(facts: NodeFacts) -> KubeletFacts:
    procs = facts.maybe("processes")
    kub = procs.by_name("kubelet") if procs else []
    pid = kub[0].pid if kub else None
    argv = list(kub[0].argv) if kub else []
    flags = kubelet_flags.parse(argv) if argv else {}
    config_path = flags.get("config") or DEFAULT_CONFIG
    text = facts.read_text(config_path)
    config: dict[str, Any] = {}
    sources = []
    if text is None and "config" in flags:
        facts.gap(config_path, "missing (named by kubelet --config); settings fall back to flags and defaults")
    if text is not None:
        parsed = _load_yaml(text)
        if parsed is None:
            facts.gap(config_path, "not a YAML mapping (garbage or truncated)")
        else:
            config = parsed
            sources.append(config_path)
    if pid is None and text is None:
        raise FactUnavailable(f"no kubelet process found and {config_path} is unreadable")
    if pid is not None:
        sources.append(f"/proc/{pid}/cmdline")
    root_dir = flags.get("root-dir", DEFAULT_ROOT_DIR)
    policy, policy_src = _pick(flags, "cpu-manager-policy", config, "cpuManagerPolicy", "none", config_path)
    driver, driver_src = _pick(flags, "cgroup-driver", config, "cgroupDriver", "cgroupfs", config_path)
    gates = dict(config.get("featureGates") or {}) if isinstance(config.get("featureGates"), dict) else {}
    if "feature-gates" in flags:
        gates.update(kubelet_flags.feature_gates(flags["feature-gates"]))
    v = flags.get("v") or flags.get("verbosity")
    verbosity = int(v) if v and plausible.decimal(v) else None
    state = None
    state_text = facts.read_text(f"{root_dir}/cpu_manager_state")
    if state_text:
        try:
            state = json.loads(state_text)
            if policy_src.startswith("kubelet default") and isinstance(state, dict) and state.get("policyName"):
                policy, policy_src = str(state["policyName"]), f"{root_dir}/cpu_manager_state: policyName={state['policyName']}"
        except ValueError:
            facts.gap(f"{root_dir}/cpu_manager_state", "not JSON")
    cp_path = f"{root_dir}/device-plugins/kubelet_internal_checkpoint"
    cp = None
    cp_text = facts.read_text(cp_path)
    if cp_text is not None:
        cp = kubelet_checkpoint.parse(cp_text)
        if cp is None:
            facts.gap(cp_path, "not a device-manager checkpoint (garbage or truncated)")
    socks = facts.root.listdir(f"{root_dir}/device-plugins")
    sockets = [] if isinstance(socks, Missing) else [s for s in socks if s.endswith(".sock")]
    return KubeletFacts(pid, argv, flags, config_path if text is not None else None, config, root_dir,
                        policy, policy_src, driver, driver_src, gates, verbosity, state, cp, cp_path,
                        sockets, sources)
