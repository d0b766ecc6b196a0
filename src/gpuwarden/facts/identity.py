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
