#!/usr/bin/env python3
"""An MPS client "pod" process: a CUDA context (through MPS when CUDA_MPS_PIPE_DIRECTORY names a live
daemon), 64 MiB of device memory, then a memset + synchronize every 0.2 s until a stop file appears
or MPS_CLIENT_SECONDS (default 120) pass. One JSON line per step and per change of the loop's result,
so a daemon that dies mid-run shows as the first failing call, with its CUresult and name.
Bounded: one 64 MiB allocation, freed at exit.
"""

import ctypes
import json
import os
import sys
import time

SIZE = 64 << 20


def main() -> int:
    stop = sys.argv[1] if len(sys.argv) > 1 else ""
    limit = float(os.environ.get("MPS_CLIENT_SECONDS", "120"))
    cuda = ctypes.CDLL("libcuda.so.1")
    t0 = time.monotonic()

    def name(rc: int) -> str:
        s = ctypes.c_char_p()
        return s.value.decode() if cuda.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value else str(rc)

    def say(step: str, rc: int, **kw: object) -> None:
        print(json.dumps({"t": round(time.time(), 3), "step": step, "rc": rc, "name": name(rc), "pid": os.getpid(),
                          "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY", ""), **kw}), flush=True)

    rc = cuda.cuInit(0)
    say("cuInit", rc)
    if rc:
        return 1
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    rc = cuda.cuDeviceGet(ctypes.byref(dev), 0)
    if rc == 0:
        rc = cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    say("cuCtxCreate", rc)
    if rc:
        return 1
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(SIZE))
    say("cuMemAlloc", rc, bytes=SIZE)
    if rc:
        return 1
    last, n = None, 0
    while time.monotonic() - t0 < limit and not (stop and os.path.exists(stop)):
        rc = cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(n & 0xFF), ctypes.c_size_t(SIZE))
        if rc == 0:
            rc = cuda.cuCtxSynchronize()
        n += 1
        if rc != last:
            say("memset+sync", rc, iteration=n)
            last = rc
        time.sleep(0.2)
    cuda.cuMemFree_v2(ptr)
    cuda.cuCtxDestroy_v2(ctx)
    say("exit", 0, iterations=n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
