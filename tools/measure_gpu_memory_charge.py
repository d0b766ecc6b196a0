"""Capture real /proc and cgroup v2 memory text on a GPU machine before/after UVM and pinned allocations.

Run as root on the GPU host (CUDA runtime needed; the H200 run used torch's libcudart): writes $OUT/snaps.json,
from which tests/fixtures/memory/h200-uvm was cut. Allocates 4 GiB managed memory (touched on the host) then
2 GiB pinned host memory, so the host needs ~8 GiB free RAM.
"""
import ctypes
import glob
import json
import os
import time

OUT = os.environ["OUT"]
cg = [l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if l.startswith("0::")][0]
CG = "/sys/fs/cgroup" + cg
snaps = {}

def rd(p):
    try:
        with open(p) as f:
            return f.read()
    except OSError as e:
        return f"<error {e}>"

def snap(tag):
    d = {}
    for p in ["/proc/meminfo", "/proc/slabinfo", "/proc/vmstat", "/proc/zoneinfo", "/proc/pressure/memory",
              "/proc/pressure/io", "/proc/pressure/cpu", CG + "/memory.stat", CG + "/memory.current",
              CG + "/memory.pressure", CG + "/memory.max", CG + "/memory.min", "/sys/fs/cgroup/memory.stat",
              "/proc/self/cgroup"]:
        d[p] = rd(p)
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    d["fds"] = fds
    d["t"] = time.time()
    snaps[tag] = d

cands = glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/**/libcudart.so*", recursive=True) + \
        glob.glob("/usr/local/cuda/lib64/libcudart.so*")
print("cudart candidates", cands)
rt = ctypes.CDLL(cands[0])
snap("0-before")
rt.cudaFree(ctypes.c_void_p(0))  # init context
snap("1-context")
GB = 1 << 30
um = ctypes.c_void_p()
r = rt.cudaMallocManaged(ctypes.byref(um), ctypes.c_size_t(4 * GB), ctypes.c_uint(1))
print("cudaMallocManaged", r)
ctypes.memset(um, 1, 4 * GB)
time.sleep(1)
snap("2-managed-4GiB-touched-on-host")
pin = ctypes.c_void_p()
r = rt.cudaHostAlloc(ctypes.byref(pin), ctypes.c_size_t(2 * GB), ctypes.c_uint(0))
print("cudaHostAlloc", r)
ctypes.memset(pin, 2, 2 * GB)
time.sleep(1)
snap("3-plus-pinned-2GiB")
rt.cudaFree(um); rt.cudaFreeHost(pin)
time.sleep(1)
snap("4-freed")
meta = {"uname": os.uname()._asdict() if hasattr(os.uname(), "_asdict") else list(os.uname()), "cgroup": cg,
        "driver": rd("/proc/driver/nvidia/version"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
with open(os.path.join(OUT, "snaps.json"), "w") as f:
    json.dump({"meta": meta, "snaps": snaps}, f)
def kv(t):
    o = {}
    for l in t.splitlines():
        p = l.replace(":", " ").split()
        if len(p) >= 2:
            try: o[p[0]] = int(p[1])
            except ValueError: pass
    return o
keys_m = ["MemFree", "MemAvailable", "Cached", "AnonPages", "Shmem", "Slab", "SUnreclaim", "Unevictable", "Mlocked", "VmallocUsed", "PageTables"]
keys_c = ["anon", "file", "kernel", "kernel_stack", "pagetables", "percpu", "vmalloc", "slab", "sock", "shmem", "unevictable", "file_mapped"]
for tag, d in snaps.items():
    m = kv(d["/proc/meminfo"]); c = kv(d[CG + "/memory.stat"])
    print(tag, {k: m.get(k) for k in keys_m}, {k: c.get(k) for k in keys_c}, "current", d[CG + "/memory.current"].strip())
print("fds", snaps["3-plus-pinned-2GiB"]["fds"])
