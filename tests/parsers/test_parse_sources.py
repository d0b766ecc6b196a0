"""Parsers of /proc, driver and kubelet text: real captures, garbage, truncated and empty input."""

from __future__ import annotations

import base64
import json
import random

import pytest

from gpuwarden.parsers import (
    keyvalue,
    kubelet_checkpoint,
    kubelet_flags,
    nvidia_smi_xml,
    nvidia_version,
    proc_devices,
    proc_modules,
    proc_pid,
)
from tests.support.bundles import CAPTURE, CHECKPOINT, EXAMPLES, GPU_UUID, POD_UID

CAP = CAPTURE / "files"
HEALTHY = EXAMPLES / "healthy/files"
PROC_DEVICES = (CAP / "proc/devices").read_text()
NV_VERSION = (CAP / "proc/driver/nvidia/version").read_text()
GPU_INFO = (CAP / "proc/driver/nvidia/gpus/0000:00:06.0/information").read_text()
MODULES = (CAP / "proc/modules").read_text()
SMI_XML = (CAPTURE / "nvidia-smi-q-x.xml").read_text()
PROC_STAT = (CAP / "proc/stat").read_text()
KUBELET_ARGV = (HEALTHY / "proc/1200/cmdline").read_bytes()
PLUGIN_ENVIRON = (HEALTHY / "proc/2301/environ").read_bytes()
CHECKPOINT_TEXT = (HEALTHY / CHECKPOINT.lstrip("/")).read_text()
GARBAGE = ["", "\n\n", "\x00\xff\xfe garbage \x7f", "{]", "}}}{{{", "a: b: c:", "Character devices\n", "🙂" * 50]


# --- /proc/devices ----------------------------------------------------------------------------


def test_proc_devices_real() -> None:
    t = proc_devices.parse(PROC_DEVICES)
    assert t.char_major("nvidia-uvm") == 238
    assert t.char_major("nvidia") == 195 and t.char_major("nvidiactl") == 195
    assert t.char_major("nvidia-caps") == 241
    assert t.char["infiniband_mad"] == [231, 245]  # a name may appear twice
    assert t.name_of(238) == "nvidia-uvm"
    assert t.name_of(9999) is None
    assert t.block["virtblk"] == [254]
    assert t.char_major("virtblk") is None  # block names are not char names
    assert t.nvidia_majors() == {"nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 238, "nvidia-nvswitch": 239,
                                 "nvidia-nvlink": 240, "nvidia-caps": 241, "nvidia-caps-imex-channels": 242}


def test_proc_devices_frontend_rename() -> None:
    # driver >= 550.40 names the 195 frontend "nvidia-frontend"
    t = proc_devices.parse("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n\nBlock devices:\n")
    assert t.nvidia_majors()["nvidia"] == 195 and t.problems == ()


def test_proc_devices_truncated() -> None:
    """A cut file is no table at all: "238 nv" is not a module called "nv", and no uvm is not the honest answer."""
    cut = PROC_DEVICES[: PROC_DEVICES.index("238 nvidia-uvm") + 6]  # "238 nv"
    t = proc_devices.parse(cut)
    assert t.char == {} and t.problems == ("no 'Block devices:' section: the file is cut short",)
    assert proc_devices.parse(PROC_DEVICES[:10]).char == {}  # header cut: no section at all


@pytest.mark.parametrize("text", GARBAGE)
def test_proc_devices_garbage(text: str) -> None:
    t = proc_devices.parse(text)
    assert t.char_major("nvidia-uvm") is None and t.nvidia_majors() == {}


def test_proc_devices_lines_before_header_are_not_a_kernel_file() -> None:
    t = proc_devices.parse("195 nvidia\nCharacter devices:\n238 nvidia-uvm\n\nBlock devices:\n")
    assert t.char == {} and "not the first line" in t.problems[0]


@pytest.mark.parametrize("text, why", [
    ("Character devices:\n  0 nvidia-uvm\n\nBlock devices:\n", "major 0 of 'nvidia-uvm' is not a possible"),
    ("Character devices:\n23x8 nvidia-uvm\n\nBlock devices:\n", "is not '<major> <name>'"),
    ("Character devices:\n２３８ nvidia-uvm\n\nBlock devices:\n", "is not '<major> <name>'"),
    ("Character devices:\n283 nvidia-uvm\n\nBlock devices:\n", "no dynamic allocation gives that major"),
    ("Character devices:\n238 nvidia-uvm\n195 nvidia\n\nBlock devices:\n", "ascending order"),
    ("Character devices:\n159 nvidia\n\nBlock devices:\n", "the kernel fixes it at 195"),
    ("Character devices:\n 10 mem\n\nBlock devices:\n", "the kernel fixes it at 1"),
    ("Character devices:\n237 nvidia-uvm\n238 nvidia-uvm\n\nBlock devices:\n", "listed at two majors"),
    ("Character devices:\n238 nvidia-uvm\n238 watchdog\n\nBlock devices:\n", "a dynamic major is never shared"),
    ("Character devices:\n195 nvidia\n195 nvidia\n\nBlock devices:\n", "listed twice"),
    ("Character devices:\n512 nvidia-uvm\n\nBlock devices:\n", "is not a possible device number"),
])
def test_proc_devices_no_kernel_writes_is_malformed(text: str, why: str) -> None:
    t = proc_devices.parse(text)
    assert t.char == {} and len(t.problems) == 1 and why in t.problems[0], t.problems


def test_proc_devices_real_shapes_pass() -> None:
    """What kernels do write: a name at two majors (infiniband_mad), names sharing a fixed major,
    a dynamic major in the upper range, block majors past 255."""
    t = proc_devices.parse("Character devices:\n  4 /dev/vc/0\n  4 tty\n195 nvidia\n195 nvidiactl\n"
                           "231 infiniband_mad\n245 infiniband_mad\n511 nvidia-uvm\n\nBlock devices:\n259 blkext\n")
    assert t.problems == () and t.char_major("nvidia-uvm") == 511 and t.block == {"blkext": [259]}


# --- /proc/driver/nvidia/version --------------------------------------------------------------


def test_nvidia_version_real_open_module() -> None:
    v = nvidia_version.parse(NV_VERSION)
    assert v.version == "580.159.04" and v.open_module
    assert v.branch == 580 and v.tuple() == (580, 159, 4)
    assert v.line.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64")


@pytest.mark.parametrize("line,version,open_", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023", "535.104.05", False),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.158.01  Release Build  (dvs-builder@U16)", "570.158.01", True),
    ("NVRM version: NVIDIA UNIX Kernel Module for x86_64  570.172.08  Release Build", "570.172.08", False),
])
def test_nvidia_version_flavours(line: str, version: str, open_: bool) -> None:
    v = nvidia_version.parse(line + "\nGCC version:  gcc version 12.3.0\n")
    assert (v.version, v.open_module) == (version, open_)


@pytest.mark.parametrize("text", GARBAGE + [NV_VERSION[:30], "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "])
def test_nvidia_version_garbage_truncated_empty(text: str) -> None:
    assert nvidia_version.parse(text) is None


@pytest.mark.parametrize("text,expected", [
    ("570.158.01", (570, 158, 1)),
    ("v1.1.12", (1, 1, 12)),
    ("1.0.0-rc92", (1, 0, 0)),   # the pre-release suffix is dropped here; RuntimeFacts.runc_at_least orders it
    ("1.1.12-0ubuntu2~22.04.1", (1, 1, 12, 0)),
    ("1.2.0+dev", (1, 2, 0)),
    ("", ()),
    ("garbage", ()),
])
def test_version_tuple(text: str, expected: tuple) -> None:
    assert nvidia_version.version_tuple(text) == expected


# --- key: value -------------------------------------------------------------------------------


def test_keyvalue_gpu_information() -> None:
    kv = keyvalue.parse(GPU_INFO)
    assert kv["Model"] == "NVIDIA H200"
    assert kv["GPU UUID"] == GPU_UUID
    assert kv["Device Minor"] == "0"
    assert kv["Bus Location"] == "0000:00:06.0"  # the value's own colons are kept


@pytest.mark.parametrize("text", GARBAGE)
def test_keyvalue_garbage(text: str) -> None:
    assert isinstance(keyvalue.parse(text), dict)
    assert keyvalue.parse(": no key\n") == {}


def test_keyvalue_truncated() -> None:
    kv = keyvalue.parse(GPU_INFO[: GPU_INFO.index("Device Minor") + 6])
    assert "Device Minor" not in kv and kv["Model"] == "NVIDIA H200"


# --- /proc/modules ----------------------------------------------------------------------------


def test_proc_modules_real() -> None:
    mods = proc_modules.parse(MODULES)
    assert set(mods) == {"nvidia", "nvidia_uvm"}
    nv = mods["nvidia"]
    assert nv.size == 14299136 and nv.refcount == -1 and nv.used_by == () and nv.state == "Live"


def test_proc_modules_used_by_and_truncation() -> None:
    text = ("nvidia_uvm 1830912 4 - Live 0xffffffffc080c000 (PO)\n"
            "nvidia 14299136 160 nvidia_uvm,nvidia_modeset, Live 0xffffffffc0400000 (PO)\n"
            "drm 6226")
    mods = proc_modules.parse(text)
    assert mods["nvidia"].used_by == ("nvidia_uvm", "nvidia_modeset")
    assert mods["nvidia"].refcount == 160
    assert "drm" not in mods


@pytest.mark.parametrize("text", GARBAGE + ["nvidia notanumber 0 - Live 0x0"])
def test_proc_modules_garbage(text: str) -> None:
    assert "nvidia" not in proc_modules.parse(text)


# --- nvidia-smi -q -x ---------------------------------------------------------------------------


def test_smi_xml_real() -> None:
    r = nvidia_smi_xml.parse(SMI_XML)  # with its external DOCTYPE
    assert (r.driver_version, r.cuda_version) == ("580.159.04", "13.0")
    assert len(r.gpus) == 1
    g = r.gpus[0]
    assert g.bus_id == "00000000:00:06.0" and g.name == "NVIDIA H200" and g.uuid == GPU_UUID
    assert g.minor == 0
    assert (g.mig_current, g.mig_pending, g.persistence_mode) == ("Disabled", "Disabled", "Enabled")
    assert g.compute_mode == "Default"


@pytest.mark.parametrize("text", GARBAGE + [SMI_XML[: len(SMI_XML) // 2], SMI_XML[:-20]])
def test_smi_xml_garbage_truncated(text: str) -> None:
    assert nvidia_smi_xml.parse(text) is None


def test_smi_xml_no_gpus() -> None:
    r = nvidia_smi_xml.parse("<nvidia_smi_log><driver_version>1</driver_version></nvidia_smi_log>")
    assert r.gpus == [] and r.driver_version == "1" and r.cuda_version == ""


# --- /proc/<pid>/* ------------------------------------------------------------------------------


def test_cmdline_real() -> None:
    argv = proc_pid.cmdline(KUBELET_ARGV)
    assert argv[0] == "/usr/bin/kubelet" and "--v=2" in argv
    assert proc_pid.cmdline(b"") == [] and proc_pid.cmdline("a\0b\0") == ["a", "b"]
    assert proc_pid.cmdline(b"\xff\xfe\0x") == ["\ufffd\ufffd", "x"]


def test_start_ticks_real_self_stat() -> None:
    with open("/proc/self/stat") as f:
        text = f.read()
    ticks = proc_pid.start_ticks(text)
    assert isinstance(ticks, int) and ticks > 0
    assert int(text[text.rfind(")") + 2:].split()[19]) == ticks


def test_start_ticks_comm_with_spaces_and_parens() -> None:
    line = (HEALTHY / "proc/2301/stat").read_text()
    assert proc_pid.start_ticks(line) == 2900
    tricky = line.replace("(nvidia-device-p)", "(a) b) S 9 (c)")
    assert proc_pid.start_ticks(tricky) == 2900


@pytest.mark.parametrize("text", GARBAGE + ["2301 (nvidia-device-p) S 1 2301", "2301 (x"])
def test_start_ticks_garbage_truncated(text: str) -> None:
    assert proc_pid.start_ticks(text) is None


def test_boot_time() -> None:
    assert proc_pid.boot_time(PROC_STAT) == 1795313527.0
    with open("/proc/stat") as f:
        assert proc_pid.boot_time(f.read()) > 1e9
    assert proc_pid.boot_time("cpu 1 2 3\nbtime \n") is None  # truncated right after the key
    assert proc_pid.boot_time("btime x\n") is None
    for g in GARBAGE:
        assert proc_pid.boot_time(g) is None


def test_cgroup_lines() -> None:
    v1 = proc_pid.cgroup_lines((HEALTHY / "proc/3400/cgroup").read_text())
    assert v1 == [("12", ["devices"], "/kubepods/besteffort/pod8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b/"
                                        "4c2f0b8e9a7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d")]
    assert proc_pid.cgroup_lines("0::/init.scope\n") == [("0", [], "/init.scope")]
    assert proc_pid.cgroup_lines("4:cpu,cpuacct:/a:b\n") == [("4", ["cpu", "cpuacct"], "/a:b")]
    for g in GARBAGE:
        proc_pid.cgroup_lines(g)


def test_environ_allow_list() -> None:
    env = proc_pid.environ(PLUGIN_ENVIRON, ("PASS_DEVICE_SPECS", "NVIDIA_*"))
    assert env == {"PASS_DEVICE_SPECS": "true", "NVIDIA_VISIBLE_DEVICES": "all"}
    raw = b"AWS_SECRET_ACCESS_KEY=abc\0PASS_DEVICE_SPECS=false\0NOEQUALS\0X=1=2\0"
    assert proc_pid.environ(raw, ("PASS_DEVICE_SPECS", "X")) == {"PASS_DEVICE_SPECS": "false", "X": "1=2"}
    assert proc_pid.environ("A=1\0", ("A",)) == {"A": "1"}
    assert proc_pid.environ(b"", ("A",)) == {}


# --- kubelet flags -----------------------------------------------------------------------------


def test_kubelet_flags_real_argv() -> None:
    flags = kubelet_flags.parse(proc_pid.cmdline(KUBELET_ARGV))
    assert flags == {"config": "/var/lib/kubelet/config.yaml", "kubeconfig": "/etc/kubernetes/kubelet.conf",
                     "container-runtime-endpoint": "unix:///run/containerd/containerd.sock", "v": "2"}


def test_kubelet_flag_forms() -> None:
    argv = ["kubelet", "--cpu-manager-policy", "static", "--fail-swap-on", "--cgroup-driver=systemd", "-v", "4",
            "positional", "--feature-gates=DevicePluginCDIDevices=true,KubeletPodResourcesGet=false"]
    flags = kubelet_flags.parse(argv)
    assert flags["cpu-manager-policy"] == "static"
    assert flags["fail-swap-on"] == "true"
    assert flags["cgroup-driver"] == "systemd"
    assert flags["v"] == "4"
    assert kubelet_flags.feature_gates(flags["feature-gates"]) == {"DevicePluginCDIDevices": True,
                                                                   "KubeletPodResourcesGet": False}
    assert kubelet_flags.parse([]) == {} and kubelet_flags.parse(["kubelet"]) == {}
    assert kubelet_flags.feature_gates("garbage,,=true") == {}


# --- device manager checkpoint -----------------------------------------------------------------


def test_checkpoint_real_map_layout_and_alloc() -> None:
    cp = kubelet_checkpoint.parse(CHECKPOINT_TEXT)
    assert len(cp.entries) == 1
    e = cp.entries[0]
    assert (e.pod_uid, e.container, e.resource, e.device_ids) == (POD_UID, "trainer", "nvidia.com/gpu", (GPU_UUID,))
    assert cp.registered == {"nvidia.com/gpu": [GPU_UUID]}
    alloc = kubelet_checkpoint.decode_alloc(e.alloc_resp)
    assert [d[1] for d in alloc.devices] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"]
    assert all(d[0] == d[1] and d[2] == "rw" for d in alloc.devices)
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": GPU_UUID}
    assert alloc.cdi_devices == ()


def test_checkpoint_boot_id_of_newer_kubelets() -> None:
    doc = json.loads(CHECKPOINT_TEXT)
    assert kubelet_checkpoint.parse(CHECKPOINT_TEXT).boot_id == ""
    doc["BootID"] = "23b7bcaa-03e2-48b5-a17a-c7e0370ff260"  # beside Data, outside the checksum
    assert kubelet_checkpoint.parse(json.dumps(doc)).boot_id == doc["BootID"]
    doc["BootID"] = 7
    assert kubelet_checkpoint.parse(json.dumps(doc)).boot_id == ""


def test_checkpoint_list_layout_before_1_20() -> None:
    doc = json.loads(CHECKPOINT_TEXT)
    entry = doc["Data"]["PodDeviceEntries"][0]
    entry["DeviceIDs"] = [GPU_UUID, "GPU-2"]
    cp = kubelet_checkpoint.parse(json.dumps(doc))
    assert cp.entries[0].device_ids == (GPU_UUID, "GPU-2")
    # multi-NUMA map layout flattens every node's list
    entry["DeviceIDs"] = {"0": ["GPU-a"], "1": ["GPU-b", "GPU-c"]}
    assert kubelet_checkpoint.parse(json.dumps(doc)).entries[0].device_ids == ("GPU-a", "GPU-b", "GPU-c")
    # no "Data" envelope
    assert len(kubelet_checkpoint.parse(json.dumps(doc["Data"])).entries) == 1


@pytest.mark.parametrize("text", GARBAGE + [CHECKPOINT_TEXT[:200], CHECKPOINT_TEXT[:-3], "[]", "null", "42", '"x"',
                                            '{"Data": []}'])
def test_checkpoint_garbage_truncated_empty(text: str) -> None:
    assert kubelet_checkpoint.parse(text) is None


@pytest.mark.parametrize("data", [
    {"PodDeviceEntries": 5},
    {"PodDeviceEntries": {"a": 1}},
    {"PodDeviceEntries": ["x", None, 3]},
    {"PodDeviceEntries": [{"DeviceIDs": {"-1": 7}}]},
    {"PodDeviceEntries": [{"DeviceIDs": {"-1": "GPU-x"}}]},
    {"PodDeviceEntries": [{"DeviceIDs": 3, "AllocResp": 5}]},
    {"PodDeviceEntries": [{"AllocResp": "!!!not base64!!!"}]},
    {"RegisteredDevices": {"nvidia.com/gpu": 3}},
    {"RegisteredDevices": [1, 2]},
])
def test_checkpoint_wrong_shapes_do_not_raise(data: dict) -> None:
    cp = kubelet_checkpoint.parse(json.dumps({"Data": data}))
    assert cp is not None
    for e in cp.entries:
        assert all(isinstance(x, str) and len(x) > 1 for x in e.device_ids)  # never a string's characters
    assert all(isinstance(v, list) for v in cp.registered.values())


def test_decode_alloc_garbage() -> None:
    assert kubelet_checkpoint.decode_alloc(b"") is None
    assert kubelet_checkpoint.decode_alloc(b"\xff\xff\xff\xff\x0f") is None
    raw = base64.b64decode(json.loads(CHECKPOINT_TEXT)["Data"]["PodDeviceEntries"][0]["AllocResp"])
    assert kubelet_checkpoint.decode_alloc(raw[: len(raw) // 2]) is None  # truncated protobuf


# --- no parser raises on arbitrary prefixes or bytes ---------------------------------------------

_REAL = [
    (proc_devices.parse, PROC_DEVICES), (nvidia_version.parse, NV_VERSION), (keyvalue.parse, GPU_INFO),
    (proc_modules.parse, MODULES), (nvidia_smi_xml.parse, SMI_XML), (proc_pid.boot_time, PROC_STAT),
    (proc_pid.start_ticks, (HEALTHY / "proc/2301/stat").read_text()), (kubelet_checkpoint.parse, CHECKPOINT_TEXT),
    (proc_pid.cgroup_lines, (HEALTHY / "proc/3400/cgroup").read_text()),
]


@pytest.mark.parametrize("fn,text", _REAL, ids=[f.__module__.rsplit(".", 1)[-1] + "." + f.__name__ for f, _ in _REAL])
def test_never_raises_on_prefixes_and_noise(fn, text: str) -> None:
    rnd = random.Random(1234)
    cuts = sorted({0, 1, len(text) // 3, len(text) // 2, len(text) - 1} | {rnd.randrange(len(text)) for _ in range(40)})
    for c in cuts:
        fn(text[:c])
    for _ in range(30):
        fn(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 400))).decode("utf-8", "replace"))
        chars = list(text)
        for _ in range(10):
            chars[rnd.randrange(len(chars))] = rnd.choice("\0:{}[]<>\n \"")
        fn("".join(chars))
