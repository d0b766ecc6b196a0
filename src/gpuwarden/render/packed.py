"""A JSON report packed into a Kubernetes termination message, and unpacked by `kubectl gpuwarden`.

A pod's termination message is how a short-lived check pod hands its result back through the API
server alone: the kubelet copies the file at `terminationMessagePath` into
`status.containerStatuses[].state.terminated.message`, cut at 4096 bytes. A report does not always
fit as text, so it is gzipped and base64-encoded; when even that is too big, the evidence, remedy
and gaps are left out (`"packed": "reduced"`) and the full report is in the pod's log.
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

PREFIX = "gpuwarden.report+gzip+base64:"
LIMIT = 4096  # bytes the kubelet keeps of a termination message

_KEEP_FINDING = ("code", "status", "severity", "family", "title", "summary", "affected")


def _encode(report: dict) -> str:
    raw = json.dumps(report, separators=(",", ":"), sort_keys=False).encode()
    return PREFIX + base64.b64encode(gzip.compress(raw, 9, mtime=0)).decode("ascii")


def pack(report: dict, limit: int = LIMIT) -> str:
    """The report as a termination message of at most `limit` bytes: whole if it fits, else reduced."""
    text = _encode(report)
    if len(text) <= limit:
        return text
    findings = [{k: f.get(k) for k in _KEEP_FINDING} for f in report.get("findings") or []]
    reduced = {**{k: v for k, v in report.items() if k not in ("unavailable", "not_evaluated")},
               "findings": findings, "packed": "reduced"}
    while True:
        text = _encode(reduced)
        if len(text) <= limit or not reduced["findings"]:
            return text
        reduced["findings"] = reduced["findings"][:-1]  # worst first: drop the least severe
        reduced["packed_findings_dropped"] = reduced.get("packed_findings_dropped", 0) + 1


def unpack(message: str) -> dict[str, Any] | None:
    """The report in a termination message, or None when it holds none (empty, cut, or other text)."""
    message = (message or "").strip()
    if message.startswith("{"):
        try:
            return json.loads(message)
        except ValueError:
            return None
    if not message.startswith(PREFIX):
        return None
    try:
        return json.loads(gzip.decompress(base64.b64decode(message[len(PREFIX):], validate=True)))
    except (ValueError, OSError, EOFError):
        return None
