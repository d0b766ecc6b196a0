"""cgroup v1 `devices.list` and OCI `linux.resources.devices` rules, with the kernel's semantics.

devices.list shows the exceptions of a default-deny cgroup (or `a *:* rwm` when
everything is allowed). An access is allowed when one entry matches type
(`a` matches both), major and minor (`*` matches any), and the requested
access is a subset of that entry's access (security/device_cgroup.c,
match_exception: entries with the same device are merged on write).
"""

from __future__ import annotations

from msgspec import Struct

from gpuwarden.parsers import plausible


class DeviceRule(Struct, frozen=True):
    """One rule of a v1 devices cgroup's devices.list."""
    type: str  # "a" | "c" | "b"
    major: int | None  # None = "*"
    minor: int | None
    access: frozenset[str]
    line: str = ""
    allow: bool = True

    def matches(self, dev_type: str, major: int, minor: int) -> bool:
        if self.type != "a" and self.type != dev_type:
            return False
        if self.major is not None and self.major != major:
            return False
        if self.minor is not None and self.minor != minor:
            return False
        return True

    def __str__(self) -> str:
        mj = "*" if self.major is None else str(self.major)
        mn = "*" if self.minor is None else str(self.minor)
        acc = "".join(c for c in "rwm" if c in self.access)
        return f"{self.type} {mj}:{mn} {acc}"


def _num(s: str, hi: int) -> int | None | bool:
    """A device number, * (None), or False when it is neither (or larger than dev_t can hold)."""
    if s == "*":
        return None
    n = plausible.digits(s, hi)
    return False if n is None else n


def parse_line(line: str) -> DeviceRule | None:
    f = line.split()
    if len(f) != 3 or f[0] not in ("a", "c", "b") or ":" not in f[1]:
        # "a" alone (as written to devices.allow) means a *:* rwm
        if len(f) == 1 and f[0] == "a":
            return DeviceRule("a", None, None, frozenset("rwm"), line.strip())
        return None
    mj, _, mn = f[1].partition(":")
    major, minor = _num(mj, plausible.MAX_MAJOR), _num(mn, plausible.MAX_MINOR)
    if major is False or minor is False or not set(f[2]) <= set("rwm") or not f[2]:
        return None
    return DeviceRule(f[0], major, minor, frozenset(f[2]), line.strip())  # type: ignore[arg-type]


def parse(text: str) -> tuple[list[DeviceRule], list[str]]:
    """Rules, and the lines that were not rules (garbage/truncation)."""
    rules: list[DeviceRule] = []
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        r = parse_line(line)
        if r is None:
            bad.append(line)
        else:
            rules.append(r)
    return rules, bad


def allows(rules: list[DeviceRule], dev_type: str, major: int, minor: int, access: str = "rw") -> DeviceRule | None:
    """The v1 entry that grants the access, or None when the cgroup denies it."""
    need = set(access)
    for r in rules:
        if r.allow and r.matches(dev_type, major, minor) and need <= r.access:
            return r
    return None


def oci_allows(rules: list[DeviceRule], dev_type: str, major: int, minor: int, access: str = "rw") -> bool:
    """OCI `linux.resources.devices` semantics: the last matching rule wins, per access bit."""
    result = {c: False for c in access}
    for r in rules:
        if r.matches(dev_type, major, minor):
            for c in access:
                if c in r.access:
                    result[c] = r.allow
    return all(result.values())
