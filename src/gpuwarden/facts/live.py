"""Results of the live probes (NVML with a deadline), available only on a live node.

Bundles carry a recorded probe result in `/.gpuwarden/probes.json`, so an NVML
hang seen at collection time stays evidence offline.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.probes.bounded import Outcome

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


@dataclass
class ProbeResults:
    nvml: Outcome | None = None
    recorded: bool = False  # read back from a bundle rather than run now
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        n = self.nvml
        return {"nvml": None if n is None else {"status": n.status, "elapsed_s": round(n.elapsed_s, 3),
                                               "detail": n.detail, "value": n.value}}


def _wants_nvml(facts: NodeFacts) -> bool:
    from gpuwarden.probes import nvml

    return os.path.exists(facts.root.host_path("/proc/driver/nvidia")) or bool(os.environ.get(nvml.ENV_LIBRARY))


def start_early(facts: NodeFacts) -> None:
    """Fork the slow probes before the rest of the check runs, so their latency overlaps it."""
    if facts.root.live and facts.settings.probes and "nvml" not in facts.early and _wants_nvml(facts):
        from gpuwarden.probes import nvml

        facts.early["nvml"] = nvml.start(facts.settings.probe_timeout_s)


def run_probes(facts: NodeFacts) -> ProbeResults:
    res = ProbeResults()
    pending = facts.early.pop("nvml", None)
    if pending is not None:
        res.nvml = pending.result()
    elif _wants_nvml(facts):
        from gpuwarden.probes import nvml

        res.nvml = nvml.probe(facts.settings.probe_timeout_s)
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
        n = doc.get("nvml")
        nvml = None if not n else Outcome(n.get("status", "error"), float(n.get("elapsed_s", 0)), n.get("value"),
                                           detail=n.get("detail", ""))
        return ProbeResults(nvml, recorded=True)
    if not facts.settings.probes:
        raise FactUnavailable("live probes disabled (--no-probes)")
    return run_probes(facts)
