#!/usr/bin/env python3
"""Stands in for a GPU pod whose driver memory the host cannot see: unified memory touched on the host.

Allocates GIB GiB (argv[1], default 4) with cudaMallocManaged and writes every byte from the CPU, so
the pages live in host RAM, owned by the NVIDIA UVM driver; prints one JSON line, then waits. Plain
cudaMalloc would stay on the GPU; never ask for more managed memory than the card has free.
"""

import ctypes
import glob
import json
import os
import sys
import time

GIB = 1 << 30


def cudart() -> ctypes.CDLL:
    cands = sorted(glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/**/libcudart.so*", recursive=True)
                   + glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
    if not cands:
        raise SystemExit(json.dumps({"error": "no libcudart"}))
    return ctypes.CDLL(cands[0])


def main() -> None:
    size = int(float(sys.argv[1]) * GIB) if len(sys.argv) > 1 else 4 * GIB
    rt = cudart()
    rt.cudaFree(ctypes.c_void_p(0))
    ptr = ctypes.c_void_p()
    rc = rt.cudaMallocManaged(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_uint(1))
    if rc == 0:
        ctypes.memset(ptr, 1, size)
    print(json.dumps({"pid": os.getpid(), "cudaMallocManaged": rc, "bytes": size}), flush=True)
    time.sleep(float(os.environ.get("WORKER_SLEEP", "600")))


if __name__ == "__main__":
    main()
