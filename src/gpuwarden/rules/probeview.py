"""Read live-probe results defensively.

The `probes` section is written elsewhere and may be an object with one attribute per probe,
a mapping, or carry a `results` mapping; a result may be an object or a dict with `status`
("ok" | "timeout" | "error" | …) and `detail`. Rules only need "did probe X time out, and
what did it say", so they ask through here and never depend on the exact shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwarden.facts import NodeFacts


@dataclass(frozen=True)
class ProbeView:
    name: str
    status: str
    detail: str
    elapsed_s: float | None


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def probe(facts: NodeFacts, name: str) -> ProbeView | None:
    """The result of live probe `name` ("nvml", …), or None when there is none."""
    probes = facts.maybe("probes")
    if probes is None:
        return None
    r = _get(probes, name)
    if r is None:
        r = _get(_get(probes, "results"), name)
    if r is None:
        return None
    status = _get(r, "status")
    if status is None:
        return None
    detail = _get(r, "detail") or _get(r, "error") or _get(r, "message") or ""
    elapsed = _get(r, "elapsed_s") or _get(r, "duration_s") or _get(r, "timeout_s")
    return ProbeView(name, str(getattr(status, "value", status)).lower(), str(detail),
                     float(elapsed) if isinstance(elapsed, (int, float)) else None)
