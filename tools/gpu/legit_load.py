#!/usr/bin/env python3
"""Heavy, legitimate GPU load that must raise nothing at medium or above (issue 11, no false alarms).

  legit_load.py train SECONDS   a training loop fed from pinned host memory (2 GiB pinned pool),
                                plus 1 GiB of unified memory touched on the host (within the pod's limit)
  legit_load.py small SECONDS   a small CUDA process (one context, 512 MiB, matmuls)
  legit_load.py anon SECONDS    2 GiB of plain anonymous memory, touched (no GPU)
Sizes of `train` from the environment: GW_PINNED_GIB (2), GW_MANAGED_GIB (1).
Prints one JSON line when its memory is in place, then works until SECONDS have passed or stdin closes.
"""

import ctypes
import glob
import json
import os
import sys
import threading
import time


def main() -> None:
    kind, secs = sys.argv[1], float(sys.argv[2])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    if kind == "anon":
        hold = bytearray(2 << 30)
        for i in range(0, len(hold), 4096):
            hold[i] = 1
        print(json.dumps({"pid": os.getpid(), "kind": kind, "anon_bytes": len(hold)}), flush=True)
        stop.wait(secs)
        return
    import torch

    info = {"pid": os.getpid(), "kind": kind}
    dev = torch.device("cuda")
    if kind == "train":
        pinned = int(os.environ.get("GW_PINNED_GIB", "2"))
        pool = [torch.empty((64, 4096, 1024), dtype=torch.float32).pin_memory() for _ in range(pinned)]  # 1 GiB each
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        libs = sorted(glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/**/libcudart.so*", recursive=True))
        managed = 0
        if libs:
            rt = ctypes.CDLL(libs[0])
            ptr = ctypes.c_void_p()
            size = int(float(os.environ.get("GW_MANAGED_GIB", "1")) * (1 << 30))
            if rt.cudaMallocManaged(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_uint(1)) == 0:
                ctypes.memset(ptr, 1, size)
                managed = size
        info.update({"pinned_bytes": sum(t.numel() * 4 for t in pool), "managed_bytes": managed})
        print(json.dumps(info), flush=True)
        t0, steps = time.monotonic(), 0
        while time.monotonic() - t0 < secs and not stop.is_set():
            for buf in pool:
                x = buf[steps % 64].to(dev, non_blocking=True)
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
        torch.cuda.synchronize()
    else:
        a = torch.randn(8192, 8192, device=dev)
        print(json.dumps(info), flush=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < secs and not stop.is_set():
            a = (a @ a).tanh_()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
