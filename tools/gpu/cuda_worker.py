#!/usr/bin/env python3
"""Stands in for a GPU container's process: tries what CUDA and NVML try, reports, then waits.

Prints one JSON line: open() of /dev/nvidia-uvm and /dev/nvidiactl, cuInit's
return code (libcuda via ctypes), nvmlInit's result (nvidia-ml-py), then sleeps
so gpuwarden can inspect it as a running container process.
"""

import ctypes
import errno
import json
import os
import sys
import time


def try_open(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    os.close(fd)
    return "OK"


def main() -> None:
    out = {"pid": os.getpid(), "open": {p: try_open(p) for p in ("/dev/nvidia-uvm", "/dev/nvidiactl", "/dev/nvidia0")}}
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        out["cuInit"] = cuda.cuInit(0)
    except OSError as exc:
        out["cuInit"] = f"no libcuda: {exc}"
    try:
        import pynvml

        pynvml.nvmlInit()
        out["nvmlInit"] = "OK"
        pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_Unknown etc.
        out["nvmlInit"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out), flush=True)
    if "--exit" in sys.argv:
        return
    time.sleep(float(os.environ.get("WORKER_SLEEP", "600")))


if __name__ == "__main__":
    main()
