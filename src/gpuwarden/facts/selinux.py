"""The `selinux` fact: whether SELinux enforces, and its AVC denials on NVIDIA device nodes.

The audit log is read live (/var/log/audit/audit.log) or from a bundle's excerpt
(/.gpuwarden/logs/audit.log): `collect` does not capture the audit log, which can hold secrets.
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.node import NodeFacts, fact
from gpuwarden.logs.scan import Decoded, LogEvent, Signature, scan
from gpuwarden.parsers import lazyre
from gpuwarden.root import Missing

ENFORCE = "/sys/fs/selinux/enforce"
AUDIT_LOGS = ("/var/log/audit/audit.log", "/.gpuwarden/logs/audit.log")
AUDIT_MAX_BYTES = 64 << 20
_AVC = lazyre.compile(r'avc:\s+denied\s+\{(?P<perms>[^}]*)\}.*?comm="(?P<comm>[^"]*)".*?name="(?P<name>nvidia[^"]*)"'
                  r'.*?scontext=(?P<scontext>\S+).*?tclass=(?P<tclass>\S+)')


class SelinuxFacts(Struct):
    """SELinux enforcement and the audit log's AVC denials on nvidia* device nodes."""
    enforce: str | None  # /sys/fs/selinux/enforce as read ("1" enforcing), None: unreadable or absent
    #: AVC denials on nvidia* nodes in the first audit log found (the last 20 kept)
    denials: list[LogEvent] = field(default_factory=list)


def _avc_denials(facts: NodeFacts) -> list[LogEvent]:
    for path in AUDIT_LOGS:
        stream = facts.root.open_binary(path)
        if isinstance(stream, Missing):
            if stream.kind not in ("missing",):
                facts.gap(stream)
            continue
        sig = Signature("selinux.avc-nvidia", b"nvidia", _AVC, frozenset(), keep=20)
        try:
            got = scan(stream, [sig], lambda t: Decoded(t), log="audit", source=path, fmt="audit",
                       max_bytes=AUDIT_MAX_BYTES)
        finally:
            stream.close()
        return list(got.events)
    return []


@fact("selinux")
def collect_selinux(facts: NodeFacts) -> SelinuxFacts:
    return SelinuxFacts(facts.read_text(ENFORCE), _avc_denials(facts))
