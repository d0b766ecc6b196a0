"""The Xid table (`data/xid.yaml`): what an NVIDIA Xid means, how bad it is, who reports it.

The table is data so that a new Xid in NVIDIA's catalog is a data change. This module loads it
once, classifies an Xid number, reads the device of an `NVRM: Xid (PCI:0000:3b:00): 79, …`
line into a comparable PCI address, and decodes Xid 154's recovery action.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from gpuwarden import datafiles
from gpuwarden.findings import Severity

SCHEMA = "gpuwarden.xid/v1"
#: the catalog's application-class Xids (GPU-HW-001: they escalate only when they repeat)
APP_XIDS = frozenset({13, 31, 43, 45, 68})


@dataclass(frozen=True)
class Action:
    """One of NVIDIA's immediate-action buckets, with gpuwarden's severity and automation class."""

    name: str
    severity: Severity
    automation: str
    remedy: str


@dataclass(frozen=True)
class XidInfo:
    xid: int
    name: str
    meaning: str
    action: Action
    fatal: bool
    device_plugin: str  # "unhealthy" | "ignored"
    rule: str = "GPU-HW-001"
    known: bool = True

    @property
    def severity(self) -> Severity:
        return self.action.severity

    @property
    def app_class(self) -> bool:
        """An application-level Xid: the GPU is usually fine (restart the app). The catalog counts
        13, 31, 43, 45 and 68 as such (43 is IGNORE in NVIDIA's buckets), plus every RESTART_APP."""
        return self.action.name in ("RESTART_APP", "WORKFLOW_XID_45") or self.xid in APP_XIDS

    @property
    def benign(self) -> bool:
        """The GPU itself needs nothing (IGNORE) or only the application restarts."""
        return self.action.name == "IGNORE" or self.app_class

    def label(self) -> str:
        return f"Xid {self.xid} ({self.meaning})"


@dataclass(frozen=True)
class XidTable:
    xids: Mapping[int, XidInfo]
    actions: Mapping[str, Action]
    references: tuple[str, ...] = ()
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def get(self, xid: int) -> XidInfo:
        info = self.xids.get(xid)
        if info is not None:
            return info
        return XidInfo(xid, "", f"Xid {xid} (not in gpuwarden's table)", self.actions["UNKNOWN"], False,
                       "unhealthy", "GPU-HW-001", known=False)

    def routed_to(self, code: str) -> frozenset[int]:
        return frozenset(x for x, i in self.xids.items() if i.rule == code)


def load(text: str) -> XidTable:
    """Parse an Xid document; ValueError on a malformed one (it ships with us; tests load it)."""
    doc = datafiles.parse(text, SCHEMA, "xid table")
    actions: dict[str, Action] = {}
    for name, raw in (doc.get("actions") or {}).items():
        try:
            actions[name] = Action(name, Severity.parse(str(raw["severity"])), str(raw["automation"]),
                                   " ".join(str(raw["remedy"]).split()))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"xid table: bad action {name}: {exc}") from exc
    if "UNKNOWN" not in actions:
        raise ValueError("xid table: the UNKNOWN action is required")
    xids: dict[int, XidInfo] = {}
    for raw in doc.get("xids") or []:
        x = raw.get("xid")
        if not isinstance(x, int) or x <= 0:
            raise ValueError(f"xid table: bad xid {x!r}")
        if x in xids:
            raise ValueError(f"xid table: duplicate xid {x}")
        act = actions.get(str(raw.get("action")))
        if act is None:
            raise ValueError(f"xid table: Xid {x} names unknown action {raw.get('action')!r}")
        dp = str(raw.get("device_plugin", "unhealthy"))
        if dp not in ("unhealthy", "ignored"):
            raise ValueError(f"xid table: Xid {x}: device_plugin must be unhealthy|ignored")
        rule = str(raw.get("rule") or "GPU-HW-001")
        if not re.fullmatch(r"GPU-(HW|DRV)-\d{3}", rule):
            raise ValueError(f"xid table: Xid {x}: bad rule {rule!r}")
        xids[x] = XidInfo(x, str(raw.get("name") or ""), str(raw.get("meaning") or ""), act,
                          bool(raw.get("fatal")), dp, rule)
    return XidTable(xids, actions, tuple(str(r) for r in doc.get("references") or ()), str(doc.get("source", "")))


@functools.lru_cache(maxsize=1)
def table() -> XidTable:
    text = datafiles.read_text("xid.yaml")
    return load(text)


def classify(xid: int) -> XidInfo:
    return table().get(xid)


# -- PCI addresses ---------------------------------------------------------------------------------

_BDF = re.compile(r"(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?")


def pci_key(text: str | None) -> str | None:
    """'PCI:0000:3b:00', '00000000:3B:00.0', '0000:3b:00.0' -> '0000:3b:00' (domain:bus:device).

    The Xid line names no PCI function, so addresses compare without it.
    """
    if not text:
        return None
    t = text.strip()
    if t.upper().startswith("PCI:"):
        t = t[4:]
    m = _BDF.search(t)
    if not m:
        return None
    dom = int(m.group("dom") or "0", 16) & 0xFFFF
    return f"{dom:04x}:{int(m.group('bus'), 16):02x}:{int(m.group('dev'), 16):02x}"


# -- Xid 154 ---------------------------------------------------------------------------------------

_RECOVERY = re.compile(r"to 0x(?P<code>[0-9a-fA-F]+)(?:\s*\((?P<text>[^)]*)\))?")
RECOVERY_ACTIONS = {0x0: ("none", Severity.INFO), 0x1: ("GPU reset required", Severity.HIGH),
                    0x2: ("node reboot required", Severity.CRITICAL), 0x4: ("drain and reset", Severity.HIGH)}


def recovery_action(detail: str) -> tuple[str, Severity] | None:
    """Xid 154 'GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)'."""
    m = _RECOVERY.search(detail or "")
    if not m:
        low = (detail or "").lower()
        if "node reboot required" in low:
            return "node reboot required", Severity.CRITICAL
        if "reset required" in low or "drain and reset" in low:
            return "GPU reset required", Severity.HIGH
        return None
    code = int(m.group("code"), 16)
    name, sev = RECOVERY_ACTIONS.get(code, (m.group("text") or f"0x{code:x}", Severity.HIGH))
    return (m.group("text") or name), sev
