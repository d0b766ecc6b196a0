"""Against the real kernel: attach programs to a scratch cgroup v2, read them back, and check that the
evaluator's verdict equals what the kernel does to a process inside that cgroup.

Kernel verdict: a child process joins the cgroup, then open(2)s device nodes created beforehand
(and mknod(2)s new ones).  EPERM means the programs denied; anything else (ENXIO: no driver behind
the number, or success) means they allowed.  Skipped, with the reason, without root, without a
cgroup2 mount, without BPF_PROG_TYPE_CGROUP_DEVICE, or when this process sits in a restricting
cgroup v1 devices group (then v1 would answer too).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from gpuwarden.bpf import insn as I
from gpuwarden.bpf.evaluate import DeviceRequest, access_for_open, evaluate_all
from gpuwarden.bpf.syscall import (
    BPF_F_ALLOW_MULTI, BPF_PROG_TYPE_CGROUP_DEVICE, BpfError, BpfNotFoundError, BpfUnsupportedError,
    prog_fd_by_id, prog_info, query_cgroup_device, read_cgroup_device_programs, read_program,
)
from tests.support.devprog import (
    COMBINATIONS, NVIDIA_MAJOR, NVIDIACTL_MINOR, SCENARIOS, UVM_MAJOR, Asm, CgroupSandbox, build_order,
    LoadError, cgroup2_mount, kernel_probe, load_program,
)

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]

#: (type, major, minor) probed; filtered at run time to numbers that are unregistered or known harmless
CANDIDATES = [
    ("c", NVIDIA_MAJOR, NVIDIACTL_MINOR), ("c", NVIDIA_MAJOR, 0), ("c", NVIDIA_MAJOR, 1), ("c", NVIDIA_MAJOR, 254),
    ("c", NVIDIA_MAJOR, 2), ("c", UVM_MAJOR, 0), ("c", UVM_MAJOR, 1), ("c", 238, 0), ("c", 238, 1),
    ("c", 1, 3), ("c", 1, 5), ("b", 7, 0), ("b", 8, 0), ("b", 8, 16),
]
HARMLESS = {("c", "mem"): {3, 5}, ("c", "nvidia-frontend"): None, ("c", "nvidia"): None,
            ("c", "nvidia-uvm"): None, ("b", "loop"): None}
OPEN_MODES = {"O_RDONLY": os.O_RDONLY, "O_WRONLY": os.O_WRONLY, "O_RDWR": os.O_RDWR,
              "O_RDONLY|O_TRUNC": os.O_RDONLY | os.O_TRUNC}


def _registered() -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    kind = ""
    for line in Path("/proc/devices").read_text().splitlines():
        if line.startswith("Character"):
            kind = "c"
        elif line.startswith("Block"):
            kind = "b"
        elif line.strip():
            num, name = line.split(None, 1)
            out[(kind, int(num))] = name
    return out


def probe_devices() -> list[tuple[str, int, int]]:
    reg = _registered()
    keep = []
    for t, major, minor in CANDIDATES:
        name = reg.get((t, major))
        if name is None:
            keep.append((t, major, minor))
            continue
        minors = HARMLESS.get((t, name), set())
        if minors is None or minor in minors:
            keep.append((t, major, minor))
    return keep


def _v1_devices_restricts() -> bool:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if "devices" in ctrls.split(","):
            lst = Path("/sys/fs/cgroup/devices") / path.lstrip("/") / "devices.list"
            try:
                return lst.read_text().strip() != "a *:* rwm"
            except OSError:
                return True
    return False


@pytest.fixture(scope="module")
def live() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root: bpf(2) program load/attach, cgroup writes, mknod")
    mnt = cgroup2_mount()
    if mnt is None:
        pytest.skip("no cgroup2 (unified) hierarchy mounted")
    trivial = Asm()
    trivial.mov64_imm(0, 1)
    trivial.exit()
    try:
        os.close(load_program(trivial.assemble(), "GPL", "gw_probe"))
    except BpfError as exc:
        pytest.skip(f"kernel refuses BPF_PROG_TYPE_CGROUP_DEVICE programs: {exc}")
    if _v1_devices_restricts():
        pytest.skip("this process is in a restricting cgroup v1 devices group; kernel verdicts would mix v1 and BPF")
    return mnt


@pytest.fixture()
def node_dir(tmp_path: Path) -> Iterator[Path]:
    if os.statvfs(tmp_path).f_flag & os.ST_NODEV:
        pytest.skip(f"{tmp_path} is mounted nodev: device nodes there cannot be opened")
    yield tmp_path
    for p in tmp_path.iterdir():
        p.unlink(missing_ok=True)


def _mode(t: str) -> int:
    return stat.S_IFCHR if t == "c" else stat.S_IFBLK


def make_nodes(node_dir: Path, devices: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], str]:
    nodes = {}
    for t, major, minor in devices:
        p = node_dir / f"{t}-{major}-{minor}"
        os.mknod(p, _mode(t) | 0o666, os.makedev(major, minor))
        nodes[(t, major, minor)] = str(p)
    return nodes


def attach_scenarios(sb: CgroupSandbox, names: tuple[str, ...]) -> dict[str, bytes]:
    """Attach ``names`` (bases of nvidia prefixes are loaded only to read their xlated code)."""
    xlated: dict[str, bytes] = {}
    for n in build_order(names):
        sc = SCENARIOS[n]
        base = I.decode(xlated[sc.base]) if sc.base else None
        if base is not None and any(11 in (i.dst, i.src) for i in base):
            pytest.skip("host blinds constants (net.core.bpf_jit_harden=2): an nvcgo-style rebuild from "
                        "xlated code is rejected by the verifier (R11 is invalid)")
        code = sc.build(base)
        if n in names:
            fd = sb.attach(code, sc.license, n)
            xlated[n] = prog_info(fd).xlated
        else:
            fd = load_program(code, sc.license, n)
            try:
                xlated[n] = prog_info(fd).xlated
            finally:
                os.close(fd)
    return xlated


def kernel_vs_evaluator(cgroup: str, node_dir: Path, nodes: dict) -> list[tuple[str, bool, bool | None, object]]:
    """(label, kernel_allowed, evaluator_allowed, combined verdict) for every probe."""
    programs = [p.insns for p in read_cgroup_device_programs(cgroup, effective=True)]
    ops, asks = [], []
    for (t, major, minor), path in nodes.items():
        for label, flags in OPEN_MODES.items():
            ops.append(("open", path, flags))
            asks.append((f"open({t} {major}:{minor}, {label})", t, major, minor, access_for_open(flags)))
        ops.append(("mknod", str(node_dir / f"new-{t}-{major}-{minor}"), _mode(t) | 0o600, major, minor))
        asks.append((f"mknod({t} {major}:{minor})", t, major, minor, "m"))
    results = kernel_probe(cgroup, ops)
    out = []
    for (label, t, major, minor, access), err in zip(asks, results):
        cv = evaluate_all(programs, t, major, minor, access)
        out.append((label, err != errno.EPERM, cv.allowed, (t, major, minor, access)))
    return out


TARGETS = sorted(SCENARIOS) + [f"combo:{c}" for c in sorted(COMBINATIONS)]


@pytest.mark.parametrize("target", TARGETS)
def test_evaluator_verdict_equals_kernel_verdict(live: str, node_dir: Path, target: str) -> None:
    names = COMBINATIONS[target[6:]] if target.startswith("combo:") else (target,)
    nodes = make_nodes(node_dir, probe_devices())
    with CgroupSandbox.create(live) as sb:
        attach_scenarios(sb, names)
        rows = kernel_vs_evaluator(sb.path, node_dir, nodes)
    wrong = [f"{label}: kernel {'allows' if k else 'denies'}, evaluator {e}" for label, k, e, _ in rows if k != e]
    assert not wrong, "\n".join(wrong)
    assert any(not k for _, k, _, _ in rows) or target == "runc-allow-all"  # the probe set exercises denials
    if not any(SCENARIOS[n].known_bug for n in names):
        for label, k, _, req in rows:
            assert k == all(SCENARIOS[n].allows(DeviceRequest(*req)) for n in names), label


def test_kernel_confirms_old_nvcgo_r2_bug(live: str, node_dir: Path) -> None:
    devices = [d for d in probe_devices() if d[:2] == ("c", NVIDIA_MAJOR)]
    if ("c", NVIDIA_MAJOR, 0) not in devices:
        pytest.skip("195:0 is registered to an unknown driver here")
    nodes = make_nodes(node_dir, [("c", NVIDIA_MAJOR, 0)])
    with CgroupSandbox.create(live) as sb:
        attach_scenarios(sb, ("nvidia-r2-on-runc-default",))
        res = kernel_probe(sb.path, [("open", nodes[("c", NVIDIA_MAJOR, 0)], os.O_RDONLY),
                                     ("open", nodes[("c", NVIDIA_MAJOR, 0)], os.O_RDWR)])
    assert res[0] != errno.EPERM and res[1] == errno.EPERM  # the rules say allow; the code says no


def test_nvcgo_rebuild_rejected_on_hardened_host(live: str) -> None:
    """With net.core.bpf_jit_harden=2 the xlated code contains r11; re-submitting it cannot load."""
    if Path("/proc/sys/net/core/bpf_jit_harden").read_text().strip() != "2":
        pytest.skip("net.core.bpf_jit_harden is not 2 here (this test never changes it)")
    fd = load_program(SCENARIOS["runc-default"].build(None))
    try:
        base = prog_info(fd).insns
    finally:
        os.close(fd)
    assert any(11 in (i.dst, i.src) for i in base)
    with pytest.raises(LoadError, match="R11 is invalid"):
        os.close(load_program(SCENARIOS["nvidia-on-runc-default"].build(base)))


def test_open_is_checked_as_one_combined_access_mask(live: str, node_dir: Path) -> None:
    """A program allowing only access == READ|WRITE exactly: O_RDWR passes, O_RDONLY/O_WRONLY fail.

    Were the kernel to ask once per bit, O_RDWR would be denied too.
    """
    a = Asm()
    a.ldx(I.SIZE_W, 3, 1, 0)
    a.alu32(I.OP_RSH, 3, 16)
    a.mov64_imm(0, 0)
    a.emit(I.JMP | I.OP_JNE | I.SRC_K, 3, imm=6, to="out")
    a.mov64_imm(0, 1)
    a.label("out")
    a.exit()
    prog = a.assemble()
    node = make_nodes(node_dir, [("c", 509, 7)])[("c", 509, 7)]
    flags = [os.O_RDONLY, os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC]
    with CgroupSandbox.create(live) as sb:
        sb.attach(prog, "GPL", "exact_rw")
        res = kernel_probe(sb.path, [("open", node, f) for f in flags])
        programs = [p.insns for p in read_cgroup_device_programs(sb.path)]
    kernel = [e != errno.EPERM for e in res]
    assert kernel == [False, False, True, True]
    assert kernel == [evaluate_all(programs, "c", 509, 7, access_for_open(f)).allowed for f in flags]


def test_effective_programs_include_ancestors(live: str, node_dir: Path) -> None:
    nodes = make_nodes(node_dir, [("c", NVIDIA_MAJOR, NVIDIACTL_MINOR), ("c", UVM_MAJOR, 0), ("c", NVIDIA_MAJOR, 0)])
    with CgroupSandbox.create(live) as parent:
        attach_scenarios(parent, ("runc-gpu-no-ctl",))  # parent: nvidiactl denied
        with CgroupSandbox.create(parent.path) as child:
            attach_scenarios(child, ("runc-gpu-no-uvm",))  # child: uvm denied
            direct = query_cgroup_device(child.path, effective=False)
            eff = query_cgroup_device(child.path, effective=True)
            parent_direct = query_cgroup_device(parent.path, effective=False)
            assert direct.attach_flags == BPF_F_ALLOW_MULTI and len(direct.prog_ids) == 1
            assert eff.prog_ids[: 2] == direct.prog_ids + parent_direct.prog_ids  # own first, then ancestors
            rows = kernel_vs_evaluator(child.path, node_dir, nodes)
            only_direct = [p.insns for p in read_cgroup_device_programs(child.path, effective=False)]
    verdicts = {label: (k, e) for label, k, e, _ in rows}
    assert verdicts[f"open(c 195:{NVIDIACTL_MINOR}, O_RDWR)"] == (False, False)  # denied by the parent
    assert verdicts[f"open(c {UVM_MAJOR}:0, O_RDWR)"] == (False, False)  # denied by the child
    assert verdicts["open(c 195:0, O_RDWR)"] == (True, True)
    # reading only the directly attached program would have got nvidiactl wrong
    assert evaluate_all(only_direct, "c", NVIDIA_MAJOR, NVIDIACTL_MINOR, "rw").allowed is True


def test_readback_reports_identity_and_code(live: str) -> None:
    sc = SCENARIOS["runc-gpu"]
    code = I.encode(sc.build(None))
    with CgroupSandbox.create(live) as sb:
        fd = sb.attach(code, sc.license, "runc-gpu")
        q = query_cgroup_device(sb.path, effective=False)
        (info,) = read_cgroup_device_programs(sb.path, effective=False)
        assert read_program(q.prog_ids[0]) == info
        os.close(prog_fd_by_id(info.id))
        assert fd in sb.fds
    assert info.id == q.prog_ids[0] and info.type == BPF_PROG_TYPE_CGROUP_DEVICE and info.is_device_program
    assert info.name == "runc_gpu"
    if Path("/proc/sys/net/core/bpf_jit_harden").read_text().strip() == "2":
        assert any(11 in (i.dst, i.src) for i in info.insns)  # root's programs are constant-blinded too
    else:
        assert info.xlated == code  # cgroup-device ctx loads are not rewritten; nothing else changes here
    assert info.tag in {hashlib.sha1(code).hexdigest()[:16], hashlib.sha256(code).hexdigest()[:16]}
    assert info.verified_insns > 0 and not info.gpl_compatible


def test_typed_errors(live: str, tmp_path: Path) -> None:
    with pytest.raises(BpfNotFoundError):
        prog_fd_by_id(0x7FFF_FFF0)
    with pytest.raises(BpfUnsupportedError) as exc:
        query_cgroup_device(tmp_path)  # a directory, but not a cgroup v2 one: EBADF
    assert exc.value.errno == errno.EBADF
    with pytest.raises(FileNotFoundError):
        query_cgroup_device(tmp_path / "missing")


def test_unprivileged_caller_gets_permission_error(live: str) -> None:
    code = (
        "import os, sys\n"
        "from gpuwarden.bpf.syscall import query_cgroup_device, prog_fd_by_id, BpfPermissionError\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)  # imports first: nobody may not read them\n"
        "for call in (lambda: query_cgroup_device(sys.argv[1]), lambda: prog_fd_by_id(1)):\n"
        "    try: call(); print('ok')\n"
        "    except BpfPermissionError as e: print('EPERM', isinstance(e, PermissionError))\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}")
    out = subprocess.run([sys.executable, "-c", code, live], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["EPERM True", "EPERM True"]


def test_add_device_rules_does_what_the_hook_does_on_v2(live: str, node_dir: Path) -> None:
    """tests/support/devprog.add_device_rules (libnvidia-container's AddDeviceRules, which cri-hook-v2-update
    runs on the GPU host): runc's program, read back, gets the GPU rules prepended and replaces it -- one
    program attached, the GPU allowed where runc denied it, runc's other rules unchanged; attaching runc's
    code again in its place (what runc 1.0.0-rc9x's update did) denies the GPU again."""
    from tests.support.devprog import RUNC_DEFAULT, add_device_rules, rules, runc_program

    devices = [d for d in probe_devices() if d in {("c", NVIDIA_MAJOR, 0), ("c", 1, 3)}]
    if ("c", NVIDIA_MAJOR, 0) not in devices:
        pytest.skip("195:0 is registered to an unknown driver here")
    nodes = make_nodes(node_dir, devices)
    ops = [("open", nodes[d], os.O_RDWR) for d in devices]
    with CgroupSandbox.create(live) as sb:
        sb.attach(runc_program(RUNC_DEFAULT), "Apache", "runc_default")
        before = kernel_probe(sb.path, ops)
        runc_code = [read_program(i).xlated for i in query_cgroup_device(sb.path, effective=False).prog_ids]
        if any(11 in (i.dst, i.src) for i in I.decode(runc_code[0])):
            pytest.skip("host blinds constants (net.core.bpf_jit_harden=2): the hook's rebuild cannot load here either")
        ids = add_device_rules(sb.path, rules(f"c {NVIDIA_MAJOR}:0 rw"))
        attached = query_cgroup_device(sb.path, effective=False).prog_ids
        after = kernel_probe(sb.path, ops)
        for pid in attached:  # runc rc9x's update: its own program in place of the one attached
            fd = prog_fd_by_id(pid)
            try:
                from tests.support.devprog import detach
                detach(sb.path, fd)
            finally:
                os.close(fd)
        sb.attach(runc_code[0], "Apache", "runc_rc9x")
        reverted = kernel_probe(sb.path, ops)
    gpu = devices.index(("c", NVIDIA_MAJOR, 0))
    assert list(attached) == ids and len(ids) == 1
    assert before[gpu] == errno.EPERM and after[gpu] != errno.EPERM and reverted[gpu] == errno.EPERM
    if ("c", 1, 3) in devices:  # /dev/null: runc allows it throughout
        null = devices.index(("c", 1, 3))
        assert errno.EPERM not in (before[null], after[null], reverted[null])
