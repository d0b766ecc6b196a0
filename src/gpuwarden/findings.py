"""The result model shared by the engine, the renderers, the agent and remediation."""

from __future__ import annotations

import enum
from typing import Any

from msgspec import Struct, field
from msgspec.structs import asdict

SCHEMA = "gpuwarden.report/v1"


class Severity(enum.IntEnum):
    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Severity":
        return cls[text.strip().upper()]


class Status(str, enum.Enum):
    CONFIRMED = "confirmed"  # the failure is present now
    AT_RISK = "at-risk"  # its preconditions are present, it is not failing (yet)


class Evidence(Struct, frozen=True):
    """One thing that was read, quoted, with where it was read from."""

    source: str
    text: str

    def __str__(self) -> str:
        return f"{self.source}: {self.text}"


class Affected(Struct, frozen=True):
    """Who is hit: a pod/container, a GPU, the node itself, a process."""

    kind: str  # "container" | "pod" | "gpu" | "node" | "process" | "plugin" | "nvswitch"
    name: str
    namespace: str = ""
    uid: str = ""
    detail: str = ""
    #: a GPU's identity, where known (kind "gpu"): NVML's index (PCI bus order), UUID, PCI bus id, minor
    index: int | None = None
    uuid: str = ""
    bus_id: str = ""
    minor: int | None = None

    def __str__(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        d = f" ({self.detail})" if self.detail else ""
        return f"{self.kind} {ns}{self.name}{d}"

    def gpu_label(self) -> str:
        """`GPU 3 (0000:3b:00.0)`: how an operator names a GPU on a multi-GPU node ("" if not a GPU)."""
        if self.kind != "gpu":
            return ""
        where = self.bus_id or self.name
        return f"GPU {self.index} ({where})" if self.index is not None else f"GPU {where}"


class Finding(Struct):
    """One rule's verdict on this node: what is wrong, where, the evidence and the fix."""
    code: str
    status: Status
    severity: Severity
    title: str
    summary: str
    affected: list[Affected] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    remedy: str = ""
    references: tuple[str, ...] = ()
    mechanism: str = ""
    family: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "status": self.status.value,
            "severity": self.severity.label,
            "family": self.family,
            "title": self.title,
            "summary": self.summary,
            "mechanism": self.mechanism,
            "affected": [
                {k: v for k, v in asdict(a).items() if v is not None and v != ""} for a in self.affected
            ],
            "evidence": [{"source": e.source, "text": e.text} for e in self.evidence],
            "remedy": self.remedy,
            "references": list(self.references),
            "data": self.data,
        }

    def gpus(self) -> list[Affected]:
        """The GPUs this finding names (affected objects of kind "gpu")."""
        return [a for a in self.affected if a.kind == "gpu"]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Finding":
        """The inverse of `to_json` (a report read back from a pod, to render it as text)."""
        return cls(
            code=d["code"], status=Status(d["status"]), severity=Severity.parse(d["severity"]),
            title=d.get("title", ""), summary=d.get("summary", ""),
            affected=[Affected(**a) for a in d.get("affected") or []],
            evidence=[Evidence(e.get("source", ""), e.get("text", "")) for e in d.get("evidence") or []],
            remedy=d.get("remedy") or "", references=tuple(d.get("references") or ()),
            mechanism=d.get("mechanism") or "", family=d.get("family") or "", data=dict(d.get("data") or {}),
        )


class Gap(Struct, frozen=True):
    """Evidence that could not be read, and why."""

    source: str
    reason: str


class Skipped(Struct, frozen=True):
    """A rule that could not conclude, and which evidence it lacked."""

    code: str
    reason: str


class Report(Struct):
    """A check's whole answer: the node, its findings and what could not be read or evaluated."""
    node: dict[str, Any]
    mode: str
    findings: list[Finding] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    rules_run: int = 0
    #: rules that do not apply to this node (no DRA on it): no gap, and not in `skipped`
    not_applicable: list[Skipped] = field(default_factory=list)
    #: why this report is not a verdict on the node (no GPU, no rule evaluated); "" when it is one
    not_checked: str = ""
    duration_s: float = 0.0
    generated_at: str = ""
    tool_version: str = ""

    def sorted_findings(self) -> list[Finding]:
        return sorted(
            self.findings,
            key=lambda f: (-int(f.severity), f.status != Status.CONFIRMED, f.code),
        )

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    @property
    def not_checked_brief(self) -> str:
        """`not_checked` without its detail and hint ("no NVIDIA GPU on this host"): for a last line."""
        return self.not_checked.split(": ", 1)[0].split("; ", 1)[0].rstrip(".")

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool_version": self.tool_version,
            "generated_at": self.generated_at,
            "node": self.node,
            "mode": self.mode,
            "summary": {
                "findings": len(self.findings),
                "worst_severity": self.worst().label if self.findings else None,
                "rules_run": self.rules_run,
                "not_checked": self.not_checked or None,
                "duration_s": round(self.duration_s, 4),
            },
            "findings": [f.to_json() for f in self.sorted_findings()],
            "unavailable": [{"source": g.source, "reason": g.reason} for g in self.gaps],
            "not_evaluated": [{"code": s.code, "reason": s.reason} for s in self.skipped],
            "not_applicable": [{"code": s.code, "reason": s.reason} for s in self.not_applicable],
            "errors": list(self.errors),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Report":
        """The inverse of `to_json`."""
        summary = d.get("summary") or {}
        return cls(
            node=dict(d.get("node") or {}), mode=d.get("mode", ""),
            findings=[Finding.from_json(f) for f in d.get("findings") or []],
            gaps=[Gap(g.get("source", ""), g.get("reason", "")) for g in d.get("unavailable") or []],
            skipped=[Skipped(s.get("code", ""), s.get("reason", "")) for s in d.get("not_evaluated") or []],
            not_applicable=[Skipped(s.get("code", ""), s.get("reason", "")) for s in d.get("not_applicable") or []],
            errors=list(d.get("errors") or []), rules_run=int(summary.get("rules_run") or 0),
            not_checked=str(summary.get("not_checked") or ""),
            duration_s=float(summary.get("duration_s") or 0.0), generated_at=d.get("generated_at", ""),
            tool_version=d.get("tool_version", ""),
        )
