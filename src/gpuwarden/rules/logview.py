"""Log events as rules weigh them: of some signatures, in some logs, by default only this boot's.

An event whose time is unknown, or whose boot is unknown, counts as this boot's: a rule would
rather quote a line than hide one it cannot place.
"""

from __future__ import annotations

from gpuwarden.facts import NodeFacts
from gpuwarden.facts.boot import boot_time
from gpuwarden.facts.xids import in_current_boot
from gpuwarden.logs.scan import LogEvent


def events(facts: NodeFacts, *sig_ids: str, logs: tuple[str, ...] | None = None, current: bool = True,
           contains: str = "") -> list[LogEvent]:
    """Events of these signatures (or "family." prefixes) from the `logs` section (none without it),
    oldest first; `contains`: only lines holding it (case-insensitive)."""
    lf = facts.maybe("logs")
    if lf is None:
        return []
    boot = boot_time(facts) if current else None
    want = contains.lower()
    return [e for e in lf.events(*sig_ids, logs=logs)
            if (not want or want in e.line.lower()) and (not current or in_current_boot(e.time, boot) is not False)]
