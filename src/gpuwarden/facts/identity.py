"""Who the node is: name, kernel, driver, GPU count, cgroup version — for the report header."""

from __future__ import annotations

from gpuwarden.facts.node import NodeFacts, fact


@fact("identity")
def collect_identity(facts: NodeFacts) -> dict[str, object]:
    meta = getattr(facts.root, "meta_merged", {}) or {}
    ident: dict[str, object] = {}
    host = facts.read_text("/proc/sys/kernel/hostname")
    name = meta.get("node_name")
    name = name[:253] if isinstance(name, str) else ""  # a bundle's claim: a DNS name at most, never an object
    ident["hostname"] = (name or (host or "").strip()[:253]) or None
    kernel = facts.read_text("/proc/sys/kernel/osrelease")
    ident["kernel"] = (kernel or "").strip() or None
    driver = facts.maybe("driver")
    if driver is not None:
        ident["driver"] = driver.version.version if driver.version else None
        ident["gpus"] = len(driver.gpus)
    ctrs = facts.maybe("containers")
    if ctrs is not None:
        ident["cgroup"] = f"v{ctrs.layout.version}/{ctrs.layout.driver or '?'}"
    return {k: v for k, v in ident.items() if v is not None}


def report_identity(facts: NodeFacts) -> dict[str, object]:
    """Who was checked, as a report names it: the identity section, the root's label and the time zone.

    Only what the root says: never this machine's name for a tree that does not name itself.
    """
    out = dict(facts.maybe("identity") or {}, source=facts.root.label)
    tz = timezone_name(facts)
    if tz:
        out["timezone"] = tz
    return out


def timezone_name(facts: NodeFacts) -> str:
    """The node's time zone as an IANA name or a `+08:00` offset, or "" when the node does not say.

    The text report prints times in it beside UTC, so that they match the node's own log lines.
    """
    import datetime as dt

    from gpuwarden.facts.logs import node_tz

    try:
        tz, how = node_tz(facts)
    except Exception:  # an unreadable root: times stay UTC
        return ""
    if how.startswith("UTC (zone unknown)"):
        return ""
    if tz is dt.timezone.utc:
        return "UTC"
    key = getattr(tz, "key", None)
    if key:
        return str(key)
    off = dt.datetime.now(tz).utcoffset() or dt.timedelta(0)
    mins = int(off.total_seconds() // 60)
    return f"{'+' if mins >= 0 else '-'}{abs(mins) // 60:02d}:{abs(mins) % 60:02d}"


#: the driver's own file: absent when no NVIDIA kernel module is loaded
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"


def without_nvidia_gpu(facts: NodeFacts) -> bool:
    """The node shows it has no NVIDIA GPU: the PCI bus was read and holds none, and no NVIDIA driver is
    loaded (its version file is absent, not merely unreadable). A bus that could not be read is no proof."""
    from gpuwarden.root import Missing

    version = facts.root.stat(DRIVER_VERSION_FILE)
    if not (isinstance(version, Missing) and version.kind == "missing"):
        return False
    pci = facts.maybe("pci")
    return pci is not None and not pci.gpus()
