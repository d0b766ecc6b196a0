"""The Xid table (`data/xid.yaml`): what an NVIDIA Xid means, how bad it is, who reports it.

The table is data so that a new Xid in NVIDIA's catalog is a data change. This module loads it
once, classifies an Xid number, reads the device of an `NVRM: Xid (PCI:0000:3b:00): 79, …`
line into a comparable PCI address, decodes Xid 154's recovery action and, with NVIDIA's
"XID 144-150 Decode" sheet, the action of an NVLink5 Xid from its interrupt info, error status
and the driver branch. The NVSwitch SXid table (`data/sxid.yaml`, the Fabric Manager guide's
appendix D) grades SXids the same way: `sxid_table()`.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping

from msgspec import Struct, field
from msgspec.structs import replace

from gpuwarden import datafiles
from gpuwarden.findings import Severity
from gpuwarden.parsers import lazyre

SCHEMA = "gpuwarden.xid/v1"
#: the catalog's application-class Xids (GPU-HW-001: they escalate only when they repeat)
APP_XIDS = frozenset({13, 31, 43, 45, 68})


class XidAction(Struct, frozen=True):
    """One of NVIDIA's immediate-action buckets, with gpuwarden's severity and automation class."""

    name: str
    severity: Severity
    automation: str
    remedy: str


class XidInfo(Struct, frozen=True):
    """What an Xid code means and what to do about it (the shipped table)."""
    xid: int
    name: str
    meaning: str
    action: XidAction
    fatal: bool
    device_plugin: str  # "unhealthy" | "ignored"
    rule: str = "GPU-HW-001"
    known: bool = True
    note: str = ""
    investigate: str = ""  # the catalog's investigatory action ("" where it is blank)

    @property
    def follow_on(self) -> bool:
        """The catalog calls it the consequence of another Xid (45: "Not Solo: IGNORE (follow other
        Xid)"; 154: "informational only regarding another Xid"): act on the Xid it follows."""
        low = self.investigate.lower()
        return "follow other xid" in low or "regarding another xid" in low

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


class Repeat(Struct, frozen=True):
    """A threshold per time window: `count` events within `window_s` seconds."""

    count: int = 3
    window_s: float = 24 * 3600.0

    def reached(self, times: list[float], now: float | None = None) -> bool:
        """Whether `count` of the times fall within one window that has not yet passed at `now`
        (so a burst stops counting once the window ends with no new event: the verdict clears)."""
        ts = sorted(t for t in times if now is None or now - self.window_s <= t <= now + 120.0)
        return any(j - i + 1 >= self.count for i in range(len(ts))
                   for j in range(i, len(ts)) if ts[j] - ts[i] <= self.window_s)

    def describe(self) -> str:
        h = self.window_s / 3600.0
        return f"{self.count} within {h:g} h" if h >= 1 else f"{self.count} within {self.window_s:g} s"


class XidTable(Struct, frozen=True):
    """The shipped Xid table: codes, actions, references and NVLink5 decoding."""
    xids: Mapping[int, XidInfo]
    actions: Mapping[str, XidAction]
    references: tuple[str, ...] = ()
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    catalog: Mapping[str, Any] = field(default_factory=dict)  # read (date), url, via, last_xid
    nvlink5: tuple["Nvlink5Row", ...] = ()
    #: a non-fatal (application-class) Xid points at the GPU when it repeats this often within the window
    repeat: "Repeat" = field(default_factory=lambda: Repeat())

    def get(self, xid: int) -> XidInfo:
        info = self.xids.get(xid)
        if info is not None:
            return info
        read = self.catalog.get("read", "")
        return XidInfo(xid, "", f"Xid {xid}: not in NVIDIA's catalog as read {read or 'by gpuwarden'}",
                       self.actions["UNKNOWN"], False, "unhealthy", "GPU-HW-001", known=False)

    def routed_to(self, code: str) -> frozenset[int]:
        return frozenset(x for x, i in self.xids.items() if i.rule == code)


def load(text: str) -> XidTable:
    """Parse an Xid document; ValueError on a malformed one (it ships with us; tests load it)."""
    doc = datafiles.parse(text, SCHEMA, "xid table")
    actions: dict[str, XidAction] = {}
    for name, raw in (doc.get("actions") or {}).items():
        try:
            actions[name] = XidAction(name, Severity.parse(str(raw["severity"])), str(raw["automation"]),
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
        if not re.fullmatch(r"GPU-(HW|DRV)-[0-9]{3}", rule):
            raise ValueError(f"xid table: Xid {x}: bad rule {rule!r}")
        xids[x] = XidInfo(x, str(raw.get("name") or ""), str(raw.get("meaning") or ""), act,
                          bool(raw.get("fatal")), dp, rule, note=str(raw.get("note") or ""),
                          investigate=str(raw.get("investigate") or ""))
    rows = tuple(_nvlink5_row(r) for r in doc.get("nvlink5_decode") or [])
    repeat = _repeat(doc, "xid table")
    return XidTable(xids, actions, tuple(str(r) for r in doc.get("references") or ()), str(doc.get("source", "")),
                    catalog=dict(doc.get("catalog") or {}), nvlink5=rows, repeat=repeat)


def _repeat(doc: Mapping[str, Any], what: str) -> Repeat:
    """A table's `repeat:` window (count within window_s), checked."""
    rep = doc.get("repeat") or {}
    try:
        repeat = Repeat(int(rep.get("count", 3)), float(rep.get("window_s", 24 * 3600)))
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{what}: bad repeat {rep!r}: {exc}") from exc
    if repeat.count < 2 or not 0 < repeat.window_s <= 30 * 86400:
        raise ValueError(f"{what}: bad repeat {rep!r}")
    return repeat


@functools.lru_cache(maxsize=1)
def table() -> XidTable:
    text = datafiles.read_text("xid.yaml")
    return load(text)


def classify(xid: int) -> XidInfo:
    return table().get(xid)


_CAUSE = lazyre.compile(r"caused by previous Xid\s+([0-9]{1,4})\b", re.IGNORECASE | re.ASCII)


def named_cause(detail: str) -> int | None:
    """`45, pid=…, name=python3, Ch 00000001 caused by previous Xid 149` -> 149."""
    m = _CAUSE.search(detail or "")
    return int(m.group(1)) if m else None


# -- PCI addresses ---------------------------------------------------------------------------------

_BDF = lazyre.compile(r"(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?")


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

_RECOVERY = lazyre.compile(r"to 0x(?P<code>[0-9a-fA-F]+)(?:\s*\((?P<text>[^)]*)\))?")
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


# -- NVLink5 Xids 144-150 ----------------------------------------------------------------------------

#: the first driver branch whose NVLink5 Xids carry the V2 interrupt-info layout (the catalog's "R575")
NVLINK5_V2_BRANCH = 575
#: NVLink5 decode actions -> gpuwarden severity (None: nothing to do)
NVLINK5_ACTIONS: dict[str, Severity | None] = {"IGNORE": None, "XID_154_EVAL": Severity.LOW,
                                              "RESET_GPU": Severity.HIGH}


class Nvlink5Row(Struct, frozen=True):
    """One row of NVIDIA's "XID 144-150 Decode" sheet."""

    xid: int
    units: tuple[str, ...]  # "NETIR_LINK_EVT/NETIR_LINK_DOWN" -> both names
    v1: str
    v2: str
    status: int
    action: str
    severity: str

    def matches(self, intr: int, layout: str) -> bool:
        pattern = self.v2 if layout == "v2" else self.v1
        for i, ch in enumerate(pattern):
            bit = (intr >> (31 - i)) & 1
            if (ch == "1" and not bit) or (ch == "0" and bit):
                return False
        return True


def _nvlink5_row(raw: Mapping[str, Any]) -> Nvlink5Row:
    try:
        row = Nvlink5Row(int(raw["xid"]), tuple(str(raw["unit"]).split("/")), str(raw["v1"]), str(raw["v2"]),
                         int(str(raw["status"]), 16), str(raw["action"]), str(raw.get("severity", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"xid table: bad nvlink5_decode row {raw!r}: {exc}") from exc
    if row.action not in NVLINK5_ACTIONS or any(len(p) != 32 or set(p) - set("01-") for p in (row.v1, row.v2)):
        raise ValueError(f"xid table: bad nvlink5_decode row {raw!r}")
    return row


#: a unit as the driver prints it: `RLW_REMAP`, or a block and its sub-unit `TLW_RX/TLW_RX_PIPE0`
_UNIT = r"(?P<unit>[A-Z][A-Z0-9_]*(?:/[A-Z][A-Z0-9_]*)*)"
_NVL5 = lazyre.compile(r"^\s*" + _UNIT + r"\s+(?P<word>Link Fatal|Fatal|Non-?fatal)?\b.*?"
                   r"(?:Link\s+(?P<link>-?[0-9]+))?\s*\((?P<intr>0x[0-9a-fA-F]+)(?:[ ,]+(?P<status>0x[0-9a-fA-F]+))?",
                   re.IGNORECASE | re.ASCII)
_NVL5_HEAD = lazyre.compile(r"^\s*" + _UNIT + r"\s+(?P<word>Link Fatal|Fatal|Non-?fatal)?"
                        r"(?:.*?\bLink\s+(?P<link>-?[0-9]+))?", re.IGNORECASE | re.ASCII)
#: the process fields some driver branches print before the unit: `pid=1234, name=python3, `
#: (`pid='<unknown>', name=<unknown>, ` when no process is attributed)
_PROC_FIELDS = lazyre.compile(r"^\s*(?:(?:pid|name)=(?:'[^']*'|<[^>]*>|[^,\s]*),\s*)+", re.ASCII)


def strip_process_fields(detail: str) -> str:
    """`pid=1234, name=python3, RLW_REMAP Nonfatal …` -> `RLW_REMAP Nonfatal …`."""
    return _PROC_FIELDS.sub("", detail or "", count=1)


def _unit_matches(unit: str, row: "Nvlink5Row") -> bool:
    """The line's unit is one of the row's names, or names the row's block and sub-unit together."""
    return set(unit.split("/")) <= set(row.units)


class Nvlink5Decode(Struct, frozen=True):
    """What an NVLink5 Xid line says, and what NVIDIA's decode sheet makes of it."""

    unit: str
    word: str  # the line's own "Fatal" / "Nonfatal" / "Link Fatal" ("" when absent)
    link: str
    intr: int | None
    status: int | None
    layout: str  # "v1" | "v2" | "" (not decoded)
    action: str  # IGNORE | XID_154_EVAL | RESET_GPU | "" (not decoded)
    row_severity: str = ""
    why: str = ""

    @property
    def decoded(self) -> bool:
        return bool(self.action)

    @property
    def nonfatal(self) -> bool:
        return self.word.lower().replace("-", "") == "nonfatal"


def decode_nvlink5(xid: int, detail: str, driver_branch: int | None = None,
                   rows: tuple[Nvlink5Row, ...] | None = None) -> Nvlink5Decode:
    """Decode `145, RLW_REMAP Nonfatal XC0 i0 Link 10 (0x00000082 0x00000001 …)` per NVIDIA's sheet.

    The interrupt-info layout follows the driver branch (V1 before R575, V2 from R575), as the
    sheet says: a line that does not match its branch's layout is not decoded (NVSentinel's
    published tests read an R570 line in the V2 layout the same way). With the branch unknown,
    both layouts are tried and a row counts only when the unit the line names is the row's. Several
    matching rows (no status on the line): the worst action; no row: not decoded, and the rule falls
    back on the line's own Fatal/Nonfatal word.
    """
    rows = table().nvlink5 if rows is None else rows
    detail = strip_process_fields(detail)
    m = _NVL5.search(detail)
    if m is None:
        h = _NVL5_HEAD.search(detail)
        unit, word, link = ((h.group("unit"), h.group("word") or "", h.group("link") or "") if h else ("", "", ""))
        return Nvlink5Decode(unit, word, link, None, None, "", "", why="no interrupt info on the line")
    unit, word, link = m.group("unit").upper(), m.group("word") or "", m.group("link") or ""
    intr = int(m.group("intr"), 16)
    status = int(m.group("status"), 16) if m.group("status") else None
    mine = [r for r in rows if r.xid == xid and (status is None or r.status == status)]
    if driver_branch is not None:
        layouts: tuple[str, ...] = ("v2",) if driver_branch >= NVLINK5_V2_BRANCH else ("v1",)
    else:
        layouts = ("v2", "v1")
    for layout in layouts:
        hits = [r for r in mine if r.matches(intr, layout)]
        if driver_branch is None or any(_unit_matches(unit, r) for r in hits):
            hits = [r for r in hits if _unit_matches(unit, r)]
        if not hits:
            continue
        worst = max(hits, key=lambda r: _rank(r.action))
        why = (f"{layout.upper()} layout, " + (f"driver R{driver_branch}" if driver_branch is not None
                                                  else "driver branch unknown: the line's unit matches")
               + ("" if status is not None else "; no error status on the line: the worst of its rows"))
        return Nvlink5Decode(unit, word, link, intr, status, layout, worst.action, worst.severity, why)
    which = (f"the R{driver_branch} layout ({layouts[0].upper()})" if driver_branch is not None
             else "either layout")
    return Nvlink5Decode(unit, word, link, intr, status, "", "",
                         why=f"interrupt info 0x{intr:08x}, status {'?' if status is None else f'0x{status:08x}'}: "
                             f"no row of NVIDIA's decode sheet matches in {which}")


def _rank(action: str) -> int:
    sev = NVLINK5_ACTIONS.get(action)
    return -1 if sev is None else int(sev)


# -- NVSwitch SXids (data/sxid.yaml) ---------------------------------------------------------------

SXID_SCHEMA = "gpuwarden.sxid/v1"
#: which GPUs an SXid bucket touches: none, the GPU on the line's link (port), every GPU of the fabric
SXID_GPU_SCOPES = ("none", "link", "all")


class SxidAction(Struct, frozen=True):
    """One of gpuwarden's buckets for the Fabric Manager guide's recovery column."""

    name: str
    severity: Severity
    fatal: bool
    gpus: str  # SXID_GPU_SCOPES
    remedy: str


class SxidInfo(Struct, frozen=True):
    sxid: int
    name: str
    guide: str  # the guide's table: "D.4" …; "" for an SXid not in it
    action: SxidAction
    impact: str = ""

    @property
    def known(self) -> bool:
        return bool(self.guide)

    def label(self) -> str:
        return f"SXid {self.sxid}" + (f" ({self.name}, guide {self.guide})" if self.known else " (not in the guide's tables)")


class SxidTable(Struct, frozen=True):
    sxids: Mapping[int, SxidInfo]
    actions: Mapping[str, SxidAction]
    guide: Mapping[str, Any] = field(default_factory=dict)
    repeat: Repeat = field(default_factory=Repeat)

    def get(self, sxid: int, line_fatality: str = "") -> SxidInfo:
        """The row of `sxid`, graded up by the line's own word (a line that says Fatal is at least
        PORT_FATAL); an SXid not in the table is graded by its line alone."""
        word = line_fatality.strip().lower()
        info = self.sxids.get(sxid)
        if info is None:
            name = {"fatal": "PORT_FATAL", "non-fatal": "NONE"}.get(word, "ESCALATE")
            return SxidInfo(sxid, "", "", self.actions[name])
        if word == "fatal" and not info.action.fatal:
            return replace(info, action=self.actions["PORT_FATAL"])
        return info


def load_sxids(text: str) -> SxidTable:
    """Parse an SXid document; ValueError on a malformed one (it ships with us; tests load it)."""
    doc = datafiles.parse(text, SXID_SCHEMA, "sxid table")
    actions: dict[str, SxidAction] = {}
    for name, raw in (doc.get("actions") or {}).items():
        try:
            act = SxidAction(name, Severity.parse(str(raw["severity"])), bool(raw["fatal"]), str(raw["gpus"]),
                             " ".join(str(raw["remedy"]).split()))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"sxid table: bad action {name}: {exc}") from exc
        if act.gpus not in SXID_GPU_SCOPES:
            raise ValueError(f"sxid table: action {name}: gpus must be one of {SXID_GPU_SCOPES}")
        actions[name] = act
    missing = {"NONE", "PORT_FATAL", "ESCALATE"} - set(actions)
    if missing:
        raise ValueError(f"sxid table: actions {sorted(missing)} are required")
    rows: dict[int, SxidInfo] = {}
    for raw in doc.get("sxids") or []:
        x, act = raw.get("sxid"), actions.get(str(raw.get("action")))
        if not isinstance(x, int) or x <= 0 or x in rows:
            raise ValueError(f"sxid table: bad or duplicate sxid {x!r}")
        if act is None or not raw.get("guide"):
            raise ValueError(f"sxid table: SXid {x}: unknown action {raw.get('action')!r} or no guide table")
        rows[x] = SxidInfo(x, str(raw.get("name") or ""), str(raw["guide"]), act, str(raw.get("impact") or ""))
    return SxidTable(rows, actions, dict(doc.get("guide") or {}), _repeat(doc, "sxid table"))


@functools.lru_cache(maxsize=1)
def sxid_table() -> SxidTable:
    return load_sxids(datafiles.read_text("sxid.yaml"))
