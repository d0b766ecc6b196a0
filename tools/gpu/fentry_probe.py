#!/usr/bin/env python3
"""Does an eBPF fentry program attach to the NVIDIA driver's allocation path on this kernel, and what
does it count? (issue 11: exact per-process accounting of driver allocations, where the kernel allows.)

Kernels without CONFIG_KPROBES (the GPU machine's) have no kprobes, but fentry needs only BTF and
ftrace direct calls. This loads, through bpf(2) alone, a BPF_PROG_TYPE_TRACING program of type
fentry on `nvos_create_alloc(struct device *dev, NvU64 num_pages)` that adds `num_pages` to a per-tgid
hash map, attaches it, lets the caller run a workload, and reads the map back.
Run as root: fentry_probe.py [SYMBOL] -- CMD...   (prints one JSON line)
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import time

SYS_BPF = 321
libc = ctypes.CDLL(None, use_errno=True)
(MAP_CREATE, MAP_LOOKUP, PROG_LOAD, GET_NEXT_KEY, BTF_GET_FD_BY_ID, OBJ_GET_INFO_BY_FD, BTF_GET_NEXT_ID,
 RAW_TP_OPEN) = (0, 1, 5, 4, 19, 15, 23, 17)
BTF_KIND_FUNC = 12


def bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(SYS_BPF, cmd, buf, 128)
    if r < 0:
        raise OSError(ctypes.get_errno(), f"bpf({cmd}): {os.strerror(ctypes.get_errno())}")
    return r


def btf_types(data: bytes) -> tuple[list[tuple[int, int, int]], bytes]:
    """(name_off, kind, vlen) of every type of a BTF blob, and its string section."""
    magic, ver, flags, hlen, toff, tlen, soff, slen = struct.unpack_from("<HBBIIIII", data)
    assert magic == 0xEB9F
    types = data[hlen + toff: hlen + toff + tlen]
    strs = data[hlen + soff: hlen + soff + slen]
    out = []
    off = 0
    extra = {1: lambda v: 4, 3: lambda v: 12, 4: lambda v: 12 * v, 5: lambda v: 12 * v, 6: lambda v: 8 * v,
             13: lambda v: 8 * v, 14: lambda v: 4, 15: lambda v: 12 * v, 17: lambda v: 4, 19: lambda v: 12 * v}
    while off < len(types):
        name_off, info, _ = struct.unpack_from("<III", types, off)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        off += 12 + extra.get(kind, lambda v: 0)(vlen)
        out.append((name_off, kind, vlen))
    return out, strs


def name(strs: bytes, off: int) -> str:
    return strs[off: strs.index(b"\0", off)].decode()


def module_btf_fd(module: str) -> int:
    """An fd of the kernel BTF object of `module` (BPF_BTF_GET_NEXT_ID, then its info's name)."""
    bid = 0
    while True:
        buf = ctypes.create_string_buffer(struct.pack("<I", bid), 128)
        if libc.syscall(SYS_BPF, BTF_GET_NEXT_ID, buf, 128) < 0:
            raise SystemExit(f"no BTF object named {module}")
        bid = struct.unpack_from("<I", buf.raw, 4)[0]
        fd = bpf(BTF_GET_FD_BY_ID, struct.pack("<I", bid))
        nm = ctypes.create_string_buffer(64)
        info = ctypes.create_string_buffer(64)
        struct.pack_into("<QIIQII", info, 0, 0, 0, 0, ctypes.addressof(nm), 64, 0)  # struct bpf_btf_info
        bpf(OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, 64, ctypes.addressof(info)))
        if nm.value.decode() == module:
            return fd
        os.close(fd)


def main() -> None:
    sym = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "--" else "nvos_create_alloc"
    cmd = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else ["sleep", "1"]
    out: dict = {"symbol": sym}
    t0 = time.monotonic()
    base_types, base_strs = btf_types(open("/sys/kernel/btf/vmlinux", "rb").read())
    types, strs = btf_types(open("/sys/kernel/btf/nvidia", "rb").read())
    # split BTF: type ids and string offsets continue after the base's (vmlinux)
    n0, s0 = len(base_types), len(base_strs)
    fid = next((n0 + 1 + i for i, (no, k, _) in enumerate(types)
                if k == BTF_KIND_FUNC and no >= s0 and name(strs, no - s0) == sym), None)
    out["btf_func_id"] = fid
    if fid is None:
        print(json.dumps(out | {"error": f"{sym} not in the module's BTF"}))
        return
    btf_fd = module_btf_fd("nvidia")
    # hash map: u32 tgid -> u64 pages
    mfd = bpf(MAP_CREATE, struct.pack("<IIIII", 1, 4, 8, 4096, 0))
    # r6 = ctx; r7 = *(u64*)(r6+8) (arg 1: num_pages); key = tgid; lookup; add or insert
    I = lambda op, dst=0, src=0, off=0, imm=0: struct.pack("<BBhi", op, dst | (src << 4), off, imm)
    prog = b"".join([
        I(0xBF, 6, 1), I(0x79, 7, 6, 8),                      # r6 = r1; r7 = *(u64 *)(r6 + 8)
        I(0x85, imm=14), I(0x77, 0, imm=32),                  # r0 = get_current_pid_tgid(); r0 >>= 32
        I(0x63, 10, 0, -4),                                    # *(u32 *)(r10 - 4) = r0
        I(0x18, 1, 1, imm=mfd), I(0, 0, 0, imm=0),             # r1 = map (ld_imm64, BPF_PSEUDO_MAP_FD)
        I(0xBF, 2, 10), I(0x07, 2, imm=-4),                    # r2 = r10 - 4
        I(0x85, imm=1),                                        # r0 = map_lookup_elem(r1, r2)
        I(0x15, 0, off=2),                                     # if r0 == 0 goto +2
        I(0xDB, 0, 7, 0),                                      # lock *(u64 *)(r0 + 0) += r7
        I(0x05, off=9),                                        # goto exit (r0 = 0)
        I(0x7B, 10, 7, -16),                                   # *(u64 *)(r10 - 16) = r7
        I(0x18, 1, 1, imm=mfd), I(0, 0, 0, imm=0),
        I(0xBF, 2, 10), I(0x07, 2, imm=-4), I(0xBF, 3, 10), I(0x07, 3, imm=-16), I(0xB7, 4, imm=0),
        I(0x85, imm=2),                                        # map_update_elem(r1, r2, r3, BPF_ANY)
        I(0xB7, 0, imm=0), I(0x95),                            # exit 0
    ])
    ins = ctypes.create_string_buffer(prog)
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(65536)
    # union bpf_attr for PROG_LOAD: type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version,
    # prog_flags, prog_name[16], prog_ifindex, expected_attach_type, prog_btf_fd, func_info_rec_size, func_info,
    # func_info_cnt, line_info_rec_size, line_info, line_info_cnt, attach_btf_id, attach_btf_obj_fd
    attr = struct.pack("<IIQQIIQII16sIIIIQIIQIII", 26, len(prog) // 8, ctypes.addressof(ins), ctypes.addressof(lic),
                       1, 65536, ctypes.addressof(log), 0, 0, b"gw_nvalloc", 0, 24, 0, 0, 0, 0, 0, 0, 0, fid, btf_fd)
    try:
        pfd = bpf(PROG_LOAD, attr)
    except OSError as exc:
        print(json.dumps(out | {"error": f"load: {exc}", "verifier": log.value.decode(errors="replace")[-1500:]}))
        return
    out["loaded"] = True
    try:
        lfd = bpf(RAW_TP_OPEN, struct.pack("<QI", 0, pfd))
    except OSError as exc:
        print(json.dumps(out | {"error": f"attach: {exc}"}))
        return
    out["attached"] = True
    out["setup_s"] = round(time.monotonic() - t0, 3)
    t1 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out["workload_s"] = round(time.monotonic() - t1, 3)
    out["workload_tail"] = (p.stdout + p.stderr)[-800:]
    counts = {}
    key = ctypes.create_string_buffer(4)
    nxt = ctypes.create_string_buffer(4)
    val = ctypes.create_string_buffer(8)
    first = True
    while True:
        a = struct.pack("<IIQQ", mfd, 0, 0 if first else ctypes.addressof(key), ctypes.addressof(nxt))
        try:
            bpf(GET_NEXT_KEY, a)
        except OSError:
            break
        first = False
        ctypes.memmove(key, nxt, 4)
        bpf(MAP_LOOKUP, struct.pack("<IIQQ", mfd, 0, ctypes.addressof(key), ctypes.addressof(val)))
        counts[struct.unpack("<I", key.raw)[0]] = struct.unpack("<Q", val.raw)[0] * 4096
    out["bytes_by_tgid"] = counts
    os.close(lfd)
    os.close(pfd)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
