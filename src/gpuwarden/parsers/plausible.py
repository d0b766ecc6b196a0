"""What a node can physically report: the bounds every parser checks its numbers against.

A number outside these bounds is not a fact about the node but damage (a torn copy, an overflow,
a hand-edited bundle, an attacker): the parser reports it as a problem and leaves the value out,
so the section reads "unreadable: <reason>" and no rule confirms a fault from it. The bounds are
deliberately loose — a real node never comes near them — so they reject only the impossible.
"""

from __future__ import annotations

import math
import re

#: device numbers: the kernel's dev_t holds a 12-bit major and a 20-bit minor
MAX_MAJOR = (1 << 12) - 1
MAX_MINOR = (1 << 20) - 1
#: pid_max cannot exceed PID_MAX_LIMIT (4M on 64-bit)
MAX_PID = 1 << 22
#: no node holds an exbibyte of anything (memory, a file, a GPU's framebuffer)
MAX_BYTES = 1 << 60
#: page and event counters: 2^48 pages is 1 EiB of 4 KiB pages
MAX_COUNT = 1 << 48
#: a time a node can write: 2000-01-01 .. 2200-01-01 (Unix seconds)
MIN_TIME, MAX_TIME = 946_684_800.0, 7_258_118_400.0
#: PCIe link widths a device can train to
LINK_WIDTHS = frozenset({1, 2, 4, 8, 12, 16, 32})
#: NVIDIA's frontend names a GPU's node by its minor: /dev/nvidia0 .. /dev/nvidia253 (254 is
#: nvidia-modeset's, 255 nvidiactl's, all of major 195)
NVIDIA_GPU_MAX_MINOR = 253
#: a path the kernel resolves: PATH_MAX bytes in all, NAME_MAX per component (linux/limits.h)
PATH_MAX, NAME_MAX = 4096, 255
#: an NVIDIA driver version: a three-digit branch (every one since 100.14, 2007; a two-digit one
#: was never a Linux driver a CUDA container could use), then minor[.patch] ("570.158.01",
#: "580.95.05", "390.157"): "15.3.04" (the GCC line's numbers) or "0580.1" is no driver's
_DRIVER_VERSION = re.compile(r"[1-9][0-9]{2}(\.[0-9]{1,3}){1,2}")
_GPU_NODE = re.compile(r"/dev/nvidia([0-9]+)")


def in_range(v: object, lo: float, hi: float) -> bool:
    """A finite int/float within [lo, hi] (bool, NaN and infinities are not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if isinstance(v, float) and not math.isfinite(v):
        return False
    return lo <= v <= hi


def count(v: object) -> bool:
    return in_range(v, 0, MAX_COUNT)


def size(v: object) -> bool:
    return in_range(v, 0, MAX_BYTES)


def pid(v: object) -> bool:
    return in_range(v, 1, MAX_PID) and isinstance(v, int)


def timestamp(v: object) -> bool:
    return in_range(v, MIN_TIME, MAX_TIME)


def device_number(major: object, minor: object) -> bool:
    return in_range(major, 0, MAX_MAJOR) and in_range(minor, 0, MAX_MINOR)


def device_problem(path: object, major: object = None, minor: object = None) -> str | None:
    """Why a device node (as a CDI spec or a manifest names it) cannot exist, or None.

    The kernel's dev_t bounds (12-bit major, 20-bit minor), a path it can resolve (absolute, no
    NUL, within PATH_MAX and NAME_MAX), and NVIDIA's naming of GPU nodes by minor
    (/dev/nvidia<minor>, 0 .. NVIDIA_GPU_MAX_MINOR). `major`/`minor` None: not given (the runtime
    stats the host's node).
    """
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return f"device path {str(path)[:80]!r} is not an absolute path"
    if len(path.encode("utf-8", "surrogatepass")) >= PATH_MAX or any(len(c) > NAME_MAX for c in path.split("/")):
        return f"device path {path[:80]!r}… is longer than a path the kernel resolves"
    if (m := _GPU_NODE.fullmatch(path)) and (len(m[1]) > 3 or int(m[1]) > NVIDIA_GPU_MAX_MINOR):
        return f"{path[:40]}: the NVIDIA driver names GPU nodes /dev/nvidia0 .. /dev/nvidia{NVIDIA_GPU_MAX_MINOR}"
    for what, v, hi, bits in (("major", major, MAX_MAJOR, 12), ("minor", minor, MAX_MINOR, 20)):
        if v is not None and (type(v) is not int or not 0 <= v <= hi):
            return f"{path[:80]}: {what} {str(v)[:24]} is not a Linux device {what} ({bits} bits: 0 .. {hi})"
    return None


def driver_version(text: str) -> bool:
    return bool(_DRIVER_VERSION.fullmatch(text))


def decimal(text: str) -> bool:
    """Only ASCII digits: str.isdigit() also takes "５" and "²", which int() reads or refuses."""
    return text.isascii() and text.isdigit()


def digits(text: str, hi: int = MAX_COUNT) -> int | None:
    """A plain decimal count ("123") within [0, hi], else None: what a counter file may hold."""
    t = text.strip()
    if not decimal(t) or len(t) > 20:
        return None
    n = int(t)
    return n if n <= hi else None


_PCI_ADDRESS = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
#: keys of recorded probe JSON whose numbers may be negative (exit codes, NVML return codes)
_SIGNED_KEYS = frozenset({"returncode", "code", "errno", "rc", "nvml_return"})


def pci_address(text: str) -> bool:
    return bool(_PCI_ADDRESS.fullmatch(text))


def json_problem(doc: object, where: str = "", depth: int = 0) -> str | None:
    """The first impossible value in recorded probe JSON (a bundle's probes.json), or None.

    Numbers finite, not negative (but exit codes) and below MAX_BYTES; a "pid" a PID; a
    "driver_version" an NVIDIA driver version; a "bus_id" a PCI address.
    """
    if depth > 32:
        return f"{where or '/'}: nested deeper than 32 levels"
    if isinstance(doc, dict):
        for k, v in doc.items():
            key = str(k)
            at = f"{where}.{key}" if where else key
            if key == "pid" and v is not None and not pid(v):
                return f"{at} = {v!r} is not a PID"
            if key.endswith("driver_version") and isinstance(v, str) and v and not driver_version(v):
                return f"{at} = {v!r} is not an NVIDIA driver version"
            if key == "bus_id" and isinstance(v, str) and v and not pci_address(v):
                return f"{at} = {v!r} is not a PCI address"
            if key in _SIGNED_KEYS and isinstance(v, (int, float)) and in_range(v, -MAX_COUNT, MAX_COUNT):
                continue
            bad = json_problem(v, at, depth + 1)
            if bad:
                return bad
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            bad = json_problem(v, f"{where}[{i}]", depth + 1)
            if bad:
                return bad
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool) and not in_range(doc, 0, MAX_BYTES):
        return f"{where} = {doc!r} is not a possible value"
    return None
