"""'Key: value' files: /proc/driver/nvidia/gpus/*/information, /proc/<pid>/status and kin."""

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
