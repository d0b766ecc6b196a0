"""Read live-probe results defensively.

The `probes` section is written elsewhere and may be an object with one attribute per probe,
a mapping, or carry a `results` mapping; a result may be an object or a dict with `status`
("ok" | "timeout" | "error" | …) and `detail`. Rules only need "did probe X time out, and
what did it say", so they ask through here and never depend on the exact shape.
"""

from __future__ import annotations

from msgspec import Struct

from gpuwarden.facts import NodeFacts
from gpuwarden.facts.probes import result_field


class ProbeView(Struct, frozen=True):
    """One probe's outcome as the rules read it."""
    name: str
    status: str
    detail: str
    elapsed_s: float | None


def probe(facts: NodeFacts, name: str) -> ProbeView | None:
    """The result of live probe `name` ("nvml", …), or None when there is none."""
    probes = facts.maybe("probes")
    if probes is None:
        return None
    r = result_field(probes, name)
    if r is None:
        r = result_field(result_field(probes, "results"), name)
    if r is None:
        return None
    status = result_field(r, "status")
    if status is None:
        return None
    detail = result_field(r, "detail") or result_field(r, "error") or result_field(r, "message") or ""
    elapsed = result_field(r, "elapsed_s") or result_field(r, "duration_s") or result_field(r, "timeout_s")
    return ProbeView(name, str(getattr(status, "value", status)).lower(), str(detail),
                     float(elapsed) if isinstance(elapsed, (int, float)) else None)
