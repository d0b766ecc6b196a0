"""'Key: value' files (/proc/driver/nvidia/gpus/*/information, /proc/<pid>/status and kin), and
'name value' counter files of integers (/proc/vmstat, cgroup memory.stat)."""

from __future__ import annotations


def parse(text: str, sep: str = ":") -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if sep not in line:
            continue
        k, v = line.split(sep, 1)
        k = k.strip()
        if k:
            out[k] = v.strip()
    return out


def parse_numbers(text: str, *, negatives: bool = True) -> tuple[dict[str, int], tuple[str, ...]]:
    """'name value' lines of integers (/proc/vmstat, cgroup memory.stat) and the problems found;
    never raises. A cut final line, a bad line and (unless `negatives`) a negative value are
    dropped with a problem; of a repeated name the first value is kept."""
    if not isinstance(text, str):
        return {}, ("not text",)
    out: dict[str, int] = {}
    problems: list[str] = []
    lines = text.splitlines()
    truncated = bool(text) and not text.endswith("\n")
    for i, raw in enumerate(lines):
        parts = raw.split()
        if not parts:
            continue
        if truncated and i == len(lines) - 1:
            problems.append(f"line {i + 1}: cut short; dropped")
            continue
        if len(parts) != 2:
            problems.append(f"line {i + 1}: unparsable {raw[:60]!r}")
            continue
        try:
            v = int(parts[1])
        except ValueError:
            problems.append(f"line {i + 1}: bad number for {parts[0]}")
            continue
        if v < 0 and not negatives:
            problems.append(f"line {i + 1}: negative {parts[0]}")
            continue
        out.setdefault(parts[0], v)
    return out, tuple(problems)
