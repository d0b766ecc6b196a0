#!/usr/bin/env python3
"""Fills the GPU's memory with plain cudaMalloc allocations (PyTorch), leaving LEAVE_GIB free, then waits.

Used to reproduce incident 4's condition: with the GPU memory full, the driver places graphics objects
in host memory. Plain device allocations only, never managed memory; everything is released when the
process exits (stdin closed, or a signal). Prints one JSON line once filled.
"""

import json
import os
import sys

GIB = 1 << 30


def main() -> None:
    import torch

    leave = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
    hold = []
    free, total = torch.cuda.mem_get_info()
    chunk = GIB
    while free > leave * GIB + 64 * (1 << 20):
        size = min(chunk, int(free - leave * GIB))
        if size < 16 << 20:
            break
        try:
            hold.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except RuntimeError:  # fragmentation at the end: smaller chunks
            chunk //= 2
            if chunk < 16 << 20:
                break
        free, total = torch.cuda.mem_get_info()
    print(json.dumps({"pid": os.getpid(), "held_bytes": sum(t.numel() for t in hold), "free_bytes": free,
                      "total_bytes": total}), flush=True)
    sys.stdin.read()  # until the parent closes our stdin


if __name__ == "__main__":
    main()
