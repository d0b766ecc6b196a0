"""Results of the live probes (NVML, and the device-plugin sockets, each with a deadline), only on a live node.

Bundles carry a recorded probe result in `/.gpuwarden/probes.json`, so an NVML
or plugin hang seen at collection time stays evidence offline.
"""

from __future__ import annotations

import json
import os
from typing import Any

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import plausible
from gpuwarden.probes.bounded import ChildResult

PROBES_FILE = "/.gpuwarden/probes.json"


def result_field(obj: Any, name: str) -> Any:
    """A probe result's field, whether the result is an object or a dict (recorded JSON); None if absent."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


class ProbeResults(Struct):
    """The live probes' answers (NVML, device plugins), or those recorded in a bundle."""
    nvml: ChildResult | None = None
    recorded: bool = False  # read back from a bundle rather than run now
    extra: dict[str, Any] = field(default_factory=dict)
    #: the device-plugin sockets (probes/plugin.py): value = [{"socket", "calls": [{"rpc", "status", …}]}]
    plugin: ChildResult | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: None if o is None else {"status": o.status, "elapsed_s": round(o.elapsed_s, 3),
                                              "detail": o.detail, "value": o.value}
                for name, o in (("nvml", self.nvml), ("plugin", self.plugin))}


def _outcome(doc: Any) -> ChildResult | None:
    if not isinstance(doc, dict) or not doc:
        return None
    return ChildResult(str(doc.get("status", "error")), float(doc.get("elapsed_s") or 0), doc.get("value"),
                   detail=str(doc.get("detail", "")))


def _plugin_dir(facts: NodeFacts) -> str:
    kub = facts.maybe("kubelet")
    return f"{kub.root_dir if kub is not None else '/var/lib/kubelet'}/device-plugins"  # a node path


def _wants_nvml(facts: NodeFacts) -> bool:
    from gpuwarden.probes import nvml

    return os.path.exists(facts.root.host_path("/proc/driver/nvidia")) or bool(os.environ.get(nvml.ENV_LIBRARY))


def start_early(facts: NodeFacts) -> None:
    """Fork the slow probes before the rest of the check runs, so their latency overlaps it."""
    if not (facts.root.live and facts.settings.probes):
        return
    if "nvml" not in facts.early and _wants_nvml(facts):
        from gpuwarden.probes import nvml

        facts.early["nvml"] = nvml.start(facts.settings.probe_timeout_s)
    if "plugin" not in facts.early and facts.settings.plugin_probe:
        from gpuwarden.probes import plugin

        facts.early["plugin"] = plugin.start(facts.root, _plugin_dir(facts), facts.settings.probe_timeout_s)


def run_probes(facts: NodeFacts) -> ProbeResults:
    res = ProbeResults()
    pending = facts.early.pop("nvml", None)
    if pending is not None:
        res.nvml = pending.result()
    elif _wants_nvml(facts):
        from gpuwarden.probes import nvml

        res.nvml = nvml.probe(facts.settings.probe_timeout_s)
    if "plugin" in facts.early:
        pending = facts.early.pop("plugin")
    elif facts.settings.plugin_probe:
        from gpuwarden.probes import plugin

        pending = plugin.start(facts.root, _plugin_dir(facts), facts.settings.probe_timeout_s)
    else:
        pending = None
    if pending is not None:
        res.plugin = pending.result()
    return res


@fact("probes")
def collect_probes(facts: NodeFacts) -> ProbeResults:
    if not facts.root.live:
        text = facts.read_text(PROBES_FILE)
        if text is None:
            raise FactUnavailable("no probe results recorded in this bundle")
        try:
            doc = json.loads(text)
        except ValueError:
            raise FactUnavailable(f"{PROBES_FILE} is not JSON") from None
        if not isinstance(doc, dict):
            raise FactUnavailable(f"{PROBES_FILE} is not a JSON object")
        why = plausible.json_problem(doc)
        if why:
            raise FactUnavailable(f"{PROBES_FILE} unreadable: impossible value ({why})")
        return ProbeResults(_outcome(doc.get("nvml")), recorded=True, plugin=_outcome(doc.get("plugin")))
    if not facts.settings.probes:
        raise FactUnavailable("live probes disabled (--no-probes)")
    return run_probes(facts)
