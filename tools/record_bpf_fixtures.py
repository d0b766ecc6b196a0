"""Record what the kernel returns for each device-program shape: ``python3 tools/record_bpf_fixtures.py``.

Needs root.  ``--blinding`` also records two programs loaded while net.core.bpf_jit_harden=2
(the sysctl is restored afterwards), to capture the kernel's constant-blinded xlated code.

Loads every scenario of tests/support/devprog.py as BPF_PROG_TYPE_CGROUP_DEVICE,
reads the translated code back with gpuwarden.bpf.syscall.prog_info, and writes
tests/bpf/fixtures/cgroup_device_xlated.json.  nvidia-* prefixes are built over the kernel's
xlated code of their base, exactly as nvcgo does.  Not attached anywhere: load + read only.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import platform
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src"), str(Path(__file__).resolve().parents[1])]

from gpuwarden.bpf import insn as I  # noqa: E402
from gpuwarden.bpf.syscall import prog_info  # noqa: E402
from tests.support.devprog import SCENARIOS, Asm, LoadError, build_order, load_program, systemd_program  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "bpf" / "fixtures" / "cgroup_device_xlated.json"
HARDEN = Path("/proc/sys/net/core/bpf_jit_harden")
BLINDED = ("runc-gpu-no-uvm", "nvidia-on-runc-default")


def slots(code: bytes) -> list[str]:
    return [code[i : i + 8].hex() for i in range(0, len(code), 8)]


def dead_code_program() -> list[I.Insn]:
    """A branch the verifier can prove always taken: it rewrites the code (xlated != submitted)."""
    a = Asm()
    a.ldx(I.SIZE_W, 2, 1, 4)
    a.mov64_imm(3, 5)
    a.emit(I.JMP | I.OP_JEQ | I.SRC_K, 3, imm=5, to="live")
    a.mov64_imm(0, 0)
    a.exit()
    a.label("live")
    a.jne_imm(2, 195, "deny")
    a.mov64_imm(0, 1)
    a.exit()
    a.label("deny")
    a.mov64_imm(0, 0)
    a.exit()
    return a.assemble()


def load_and_read(code: bytes, license: str, name: str) -> dict:
    fd = load_program(code, license, name)
    try:
        info = prog_info(fd)
    finally:
        os.close(fd)
    return {"tag": info.tag, "name": info.name, "verified_insns": info.verified_insns,
            "submitted": slots(code), "xlated": slots(info.xlated)}


def record_blinded(xlated: dict[str, bytes]) -> dict[str, dict]:
    """Load some scenarios with constant blinding forced on; restores the sysctl whatever happens."""
    old = HARDEN.read_text().strip()
    out: dict[str, dict] = {}
    try:
        HARDEN.write_text("2")
        for name in BLINDED:
            sc = SCENARIOS[name]
            base = I.decode(xlated[sc.base]) if sc.base else None
            rec = load_and_read(I.encode(sc.build(base)), sc.license, name)
            out[f"blinded:{name}"] = {"doc": f"{name} loaded with net.core.bpf_jit_harden=2 (constant blinding)",
                                      "license": sc.license, "scenario": name, **rec}
    finally:
        HARDEN.write_text(old)
    return out


def main() -> None:
    programs: dict[str, dict] = {}
    xlated: dict[str, bytes] = {}
    for name in build_order(SCENARIOS):
        sc = SCENARIOS[name]
        base = I.decode(xlated[sc.base]) if sc.base else None
        code = I.encode(sc.build(base))
        rec = load_and_read(code, sc.license, name)
        xlated[name] = bytes.fromhex("".join(rec["xlated"]))
        programs[name] = {"doc": sc.doc, "license": sc.license, "base": sc.base, **rec}

    extra = {"verifier-dead-code": {"doc": "always-taken branch: verifier deletes dead code and the branch",
                                    "license": "GPL",
                                    **load_and_read(I.encode(dead_code_program()), "GPL", "dead_code")}}
    if "--blinding" in sys.argv[1:]:
        extra.update(record_blinded(xlated))
    rejected: dict[str, dict] = {}
    empty = I.encode(systemd_program(()))
    try:
        os.close(load_program(empty, "GPL", "systemd_empty"))
        rejected_note = None
    except LoadError as exc:
        rejected_note = {"errno": errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                         "verifier": exc.log.strip().splitlines()[0] if exc.log.strip() else ""}
    if rejected_note:
        rejected["systemd-closed-empty"] = {"doc": "systemd closed policy with zero entries", "submitted": slots(empty),
                                            **rejected_note}

    doc = {
        "ORIGIN": (
            f"Recorded {dt.date.today().isoformat()} on Linux {platform.release()} {platform.machine()} "
            f"by `python3 tools/record_bpf_fixtures.py` as root: each program built by tests/support/devprog.py, "
            f"loaded with BPF_PROG_LOAD (BPF_PROG_TYPE_CGROUP_DEVICE, not attached), read back with "
            f"BPF_OBJ_GET_INFO_BY_FD xlated_prog_insns (gpuwarden.bpf.syscall.prog_info). "
            f"extra/blinded:* were loaded with net.core.bpf_jit_harden=2 (run with --blinding). "
            f"Hex is one 8-byte little-endian instruction slot per string."
        ),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "programs": programs,
        "extra": extra,
        "rejected": rejected,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT} ({len(programs)} programs)")


if __name__ == "__main__":
    main()
