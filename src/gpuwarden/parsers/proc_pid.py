"""/proc/<pid>/{cmdline,stat,cgroup,environ,maps} and /proc/stat's btime."""

from __future__ import annotations

from gpuwarden.parsers import lazyre, plausible


def cmdline(raw: bytes | str) -> list[str]:
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "replace")
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def start_ticks(stat_text: str) -> int | None:
    """Field 22 (starttime, clock ticks after boot); comm may contain spaces and parens."""
    rparen = stat_text.rfind(")")
    if rparen < 0:
        return None
    fields = stat_text[rparen + 2:].split()
    # fields[0] is field 3 (state); starttime is field 22 -> index 19
    if len(fields) < 20 or not plausible.decimal(fields[19]):
        return None
    return int(fields[19])


def kernel_ticks(stat_text: str) -> int | None:
    """Field 15 (stime, clock ticks the process spent in the kernel)."""
    rparen = stat_text.rfind(")")
    fields = stat_text[rparen + 2:].split() if rparen >= 0 else []
    return int(fields[12]) if len(fields) > 12 and plausible.decimal(fields[12]) else None


def ppid(stat_text: str) -> int | None:
    """Field 4 (the parent's pid)."""
    rparen = stat_text.rfind(")")
    fields = stat_text[rparen + 2:].split() if rparen >= 0 else []
    return int(fields[1]) if len(fields) > 1 and plausible.decimal(fields[1]) else None


def boot_time(proc_stat_text: str) -> float | None:
    for line in proc_stat_text.splitlines():
        if line.startswith("btime "):
            v = line.split()[1:2]  # "btime " alone: a truncated /proc/stat
            return float(v[0]) if v and plausible.decimal(v[0]) else None
    return None


_UPTIME = lazyre.compile(r"\A([0-9]{1,12}(?:\.[0-9]{1,9})?)(?:\s|\Z)")


def uptime(proc_uptime_text: str) -> float | None:
    """Seconds since boot, the first field of /proc/uptime as the kernel writes it (digits, a fraction)."""
    m = _UPTIME.match(proc_uptime_text)
    return float(m.group(1)) if m else None


def cgroup_lines(text: str) -> list[tuple[str, list[str], str]]:
    """(hierarchy id, controllers, path); v2 is ('0', [], path)."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[0], [c for c in parts[1].split(",") if c], parts[2]))
    return out


def environ(raw: bytes | str, allow: tuple[str, ...]) -> dict[str, str]:
    """Only allow-listed variables: environments carry secrets."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "replace")
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if not sep:
            continue
        key = k.decode("utf-8", "replace")
        if any(key == a or (a.endswith("*") and key.startswith(a[:-1])) for a in allow):
            out[key] = v.decode("utf-8", "replace")
    return out


def faults(stat_text: str) -> int | None:
    """Fields 10 and 12 (minflt + majflt): page faults the process took; a driver mapping new pages takes them."""
    rparen = stat_text.rfind(")")
    fields = stat_text[rparen + 2:].split() if rparen >= 0 else []
    if len(fields) > 9 and plausible.decimal(fields[7]) and plausible.decimal(fields[9]):
        return int(fields[7]) + int(fields[9])
    return None


_MAPS = lazyre.compile(r"(?m)^([0-9a-f]{1,16})-([0-9a-f]{1,16}) \S{4} [0-9a-f]+ \S+ [0-9]+ +(/dev/(?:nvidia|dri/)\S*)")


def device_maps(maps_text: str) -> tuple[int, int]:
    """(count, bytes) of the mappings of NVIDIA and DRM device files in /proc/<pid>/maps: what a driver
    allocation mapped into the process leaves (EGL framebuffers, host-visible buffers)."""
    n = size = 0
    for m in _MAPS.finditer(maps_text):
        lo, hi = int(m.group(1), 16), int(m.group(2), 16)
        if hi > lo:
            n += 1
            size += hi - lo
    return n, size
