"""Host-side measurements for the GPU-memory scenarios: meminfo, cgroup charges, NVIDIA slab, NVML
process lists, and the driver's allocation path through kprobe events (tracefs).

Only reads, except `KprobeTrace`, which defines kprobe events named gw_* in a tracefs instance of its
own and removes them on close. Nothing here changes a GPU setting.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import time
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, _, v = line.partition(":")
        f = v.split()
        if f:
            out[k] = int(f[0]) * (1024 if len(f) > 1 else 1)
    return out


def cgroup(d: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        out["memory.current"] = int((d / "memory.current").read_text())
        for line in (d / "memory.stat").read_text().splitlines():
            k, v = line.split()
            if k in ("anon", "file", "kernel", "kernel_stack", "pagetables", "sec_pagetables", "percpu", "sock",
                     "vmalloc", "shmem", "file_mapped", "slab"):
                out[k] = int(v)
        ev = (d / "memory.events").read_text()
        out.update({f"events.{k}": int(v) for k, v in (ln.split() for ln in ev.splitlines())})
    except OSError as exc:
        out["error"] = str(exc)  # type: ignore[assignment]
    return out


def slab_nvidia() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/slabinfo").read_text().splitlines()[2:]:
            f = line.split()
            if re.match(r"^(nv|uvm)", f[0]):
                out[f[0]] = int(f[2]) * int(f[3])  # num_objs * objsize
    except OSError:
        pass
    return out


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPTE")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
        nv = 0
        cur = None
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                cur = "/dev/nvidia" in line
            elif cur and line.startswith("Rss:"):
                nv += int(line.split()[1]) * 1024
        out["nvidia_mappings_rss"] = nv
    except OSError:
        pass
    return out


def nvml_processes() -> dict:
    """NVML's per-process lists (graphics vs compute) and the GPU's memory, in a child with a deadline."""
    code = r"""
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    m = n.nvmlDeviceGetMemoryInfo(h)
    d = {"index": i, "used": m.used, "free": m.free, "total": m.total, "graphics": [], "compute": []}
    for kind, fn in (("graphics", n.nvmlDeviceGetGraphicsRunningProcesses), ("compute", n.nvmlDeviceGetComputeRunningProcesses)):
        try:
            d[kind] = [{"pid": p.pid, "used": p.usedGpuMemory} for p in fn(h)]
        except n.NVMLError as e:
            d[kind] = str(e)
    out.append(d)
print(json.dumps(out))
"""
    import json
    import sys
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
        return {"gpus": json.loads(p.stdout)} if p.returncode == 0 else {"error": p.stderr[-500:]}
    except (subprocess.TimeoutExpired, ValueError) as exc:
        return {"error": str(exc)}


def kallsyms_nvidia(pattern: str = r"alloc|free") -> list[str]:
    out = []
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                if "[nvidia" in line and re.search(pattern, line):
                    out.append(line.strip())
    except OSError:
        pass
    return out


def tracefs() -> Path | None:
    if (TRACEFS / "kprobe_events").exists():
        return TRACEFS
    try:
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if (TRACEFS / "kprobe_events").exists():
        return TRACEFS
    alt = Path("/sys/kernel/debug/tracing")
    return alt if (alt / "kprobe_events").exists() else None


class KprobeTrace:
    """kprobe events on driver functions, recorded into a private tracefs instance.

    `probes` maps an event name to its definition tail, e.g. {"gw_nvalloc": "nvos_create_alloc pages=%si:u64"}.
    """

    def __init__(self, probes: dict[str, str], kind: str = "p") -> None:
        self.root = tracefs()
        self.errors: list[str] = []
        self.defined: list[str] = []
        self.inst: Path | None = None
        if self.root is None:
            self.errors.append("no tracefs with kprobe_events")
            return
        for name, tail in probes.items():
            k = "r" if name.endswith("_ret") else kind
            try:
                with open(self.root / "kprobe_events", "a") as f:
                    f.write(f"{k}:gw/{name} {tail}\n")
                self.defined.append(name)
            except OSError as exc:
                self.errors.append(f"{name}: {exc}")
        if not self.defined:
            return
        self.inst = self.root / "instances" / "gw"
        try:
            self.inst.mkdir(exist_ok=True)
            (self.inst / "buffer_size_kb").write_text("65536")
            for name in self.defined:
                (self.inst / "events/gw" / name / "enable").write_text("1")
        except OSError as exc:
            self.errors.append(f"enable: {exc}")

    def text(self) -> str:
        try:
            return (self.inst / "trace").read_text() if self.inst else ""
        except OSError as exc:
            return f"# {exc}"

    def set_enabled(self, on: bool) -> None:
        if self.inst:
            (self.inst / "tracing_on").write_text("1" if on else "0")

    def close(self) -> None:
        if self.inst is not None:
            for name in self.defined:
                try:
                    (self.inst / "events/gw" / name / "enable").write_text("0")
                except OSError:
                    pass
            try:
                self.inst.rmdir()
            except OSError as exc:
                self.errors.append(f"rmdir instance: {exc}")
        if self.root is not None:
            for name in self.defined:
                try:
                    with open(self.root / "kprobe_events", "a") as f:
                        f.write(f"-:gw/{name}\n")
                except OSError as exc:
                    self.errors.append(f"remove {name}: {exc}")


_EV = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[\d+\].*?\s(?P<ts>[\d.]+):\s+(?P<ev>\w+):\s+\((?P<fn>[^)]*)\)\s*(?P<args>.*)$")


def parse_trace(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _EV.match(line)
        if not m:
            continue
        args = dict(a.split("=", 1) for a in m.group("args").split() if "=" in a)
        out.append({"pid": int(m.group("pid")), "comm": m.group("comm").strip(), "ev": m.group("ev"),
                    "ts": float(m.group("ts")), "args": args})
    return out


def bpf_kprobe_attach(symbol: str) -> str:
    """Whether an eBPF program of type kprobe loads and attaches to SYMBOL here (a trivial program)."""
    libc = ctypes.CDLL(None, use_errno=True)
    insns = (ctypes.c_uint64 * 2)(0xB7, 0x95)  # r0 = 0; exit
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)

    class Attr(ctypes.Structure):
        _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                    ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                    ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("pad", ctypes.c_uint8 * 64)]

    a = Attr(2, 2, ctypes.addressof(insns), ctypes.addressof(lic), 1, 4096, ctypes.addressof(log), 0)
    fd = libc.syscall(321, 5, ctypes.byref(a), ctypes.sizeof(a))
    if fd < 0:
        return f"BPF_PROG_LOAD(kprobe) failed: {os.strerror(ctypes.get_errno())} {log.value[:200]!r}"
    try:
        ptype = int(Path("/sys/bus/event_source/devices/kprobe/type").read_text())
    except OSError as exc:
        os.close(fd)
        return f"program loaded; no kprobe PMU: {exc}"

    class PerfAttr(ctypes.Structure):
        _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                    ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                    ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("wakeup", ctypes.c_uint32),
                    ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
                    ("pad", ctypes.c_uint8 * 64)]

    sym = ctypes.create_string_buffer(symbol.encode())
    pa = PerfAttr(ptype, 128, 0, 1, 0, 0, 0, 0, 0, ctypes.addressof(sym), 0)
    pfd = libc.syscall(298, ctypes.byref(pa), -1, 0, -1, 8)  # pid -1, cpu 0, PERF_FLAG_FD_CLOEXEC
    if pfd < 0:
        err = os.strerror(ctypes.get_errno())
        os.close(fd)
        return f"program loaded; perf_event_open(kprobe {symbol}) failed: {err}"
    rc = libc.ioctl(pfd, 0x40042408, fd)  # PERF_EVENT_IOC_SET_BPF
    err = os.strerror(ctypes.get_errno()) if rc < 0 else ""
    os.close(pfd)
    os.close(fd)
    return f"attached to {symbol}" if rc == 0 else f"PERF_EVENT_IOC_SET_BPF failed: {err}"


def now() -> float:
    return time.monotonic()
