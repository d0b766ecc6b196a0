"""`gpuwarden collect` on a real tree (files + mknod device nodes) and `check --bundle` of the result.

The tree is the uvm-missing example made real: same findings live (--root) and offline (--bundle),
and the tarball carries no secret: no environ value outside the allow-list, nothing from
/var/run/secrets, no spec env beyond the NVIDIA allow-list.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden.bundle.archive import BundleError, open_bundle
from gpuwarden.cli import main
from gpuwarden.root import HostRoot
from tests.support.bundles import CID_GPU, GPU_SPEC, KUBELET_PID, PLUGIN_PID, example_root, materialize

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of /dev/nvidia* nodes needs root")

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkRFTU8ifQ.service-account-token"
RELOAD_AT = 1795313560.0


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Path:
    tree = materialize(example_root("uvm-missing"), tmp_path_factory.mktemp("node") / "root")
    # secrets a careless collector would pick up
    (tree / f"proc/{KUBELET_PID}/environ").write_bytes(
        f"PATH=/usr/bin\0AWS_SECRET_ACCESS_KEY={SECRET}\0HOME=/root\0".encode())
    (tree / f"proc/{PLUGIN_PID}/environ").write_bytes(
        f"PASS_DEVICE_SPECS=true\0NVIDIA_VISIBLE_DEVICES=all\0AWS_SECRET_ACCESS_KEY={SECRET}\0".encode())
    (tree / "proc/3400/environ").write_bytes(f"NVIDIA_VISIBLE_DEVICES=GPU-x\0DB_PASSWORD={SECRET}\0".encode())
    tok = tree / "var/run/secrets/kubernetes.io/serviceaccount"
    tok.mkdir(parents=True)
    (tok / "token").write_text(TOKEN)
    spec = json.loads((tree / GPU_SPEC.lstrip("/")).read_text())
    spec["process"]["env"].append(f"AWS_SECRET_ACCESS_KEY={SECRET}")
    spec["process"]["args"] = ["python", "train.py", f"--token={TOKEN}"]
    spec["mounts"] = [{"destination": "/var/run/secrets/kubernetes.io/serviceaccount", "source": "/x"}]
    (tree / GPU_SPEC.lstrip("/")).write_text(json.dumps(spec))
    gen = tree / "run/systemd/generator"  # dates the last daemon-reload (GPU-DEV-003's cause)
    gen.mkdir(parents=True)
    os.utime(gen, (RELOAD_AT, RELOAD_AT))
    return tree


@pytest.fixture(scope="module")
def bundle(node: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "node.tar.gz"
    r = CliRunner().invoke(main, ["collect", "-o", str(out), "--root", str(node), "--timeout", "3"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert r.stdout.startswith(f"wrote {out}:")
    return out


def codes(*args: str) -> tuple[int, list[tuple[str, str]], dict]:
    r = CliRunner().invoke(main, ["check", *args, "--format", "json", "--no-probes"])
    assert r.exit_code in (0, 1), (r.output, r.exception)
    js = json.loads(r.stdout)
    return r.exit_code, sorted((f["code"], f["status"]) for f in js["findings"]), js


def test_the_tree_is_real(node: Path) -> None:
    r = HostRoot(str(node))
    st = r.stat("/dev/nvidia-uvm")
    assert (st.kind, st.major, st.minor) == ("chr", 238, 0)
    assert r.stat(f"/proc/{PLUGIN_PID}/root/dev/nvidiactl").kind == "chr"
    assert "nvidia-uvm" not in r.listdir(f"/proc/{PLUGIN_PID}/root/dev")


def test_live_tree_and_bundle_agree(node: Path, bundle: Path) -> None:
    live_code, live, live_js = codes("--root", str(node))
    off_code, off, off_js = codes("--bundle", str(bundle))
    assert ("GPU-DEV-001", "confirmed") in live
    assert live == off and live_code == off_code == 1
    assert live_js["mode"] == "live" and off_js["mode"] == "bundle"
    dev1 = next(f for f in off_js["findings"] if f["code"] == "GPU-DEV-001")
    assert any(e["text"] == "238 nvidia-uvm" for e in dev1["evidence"])
    assert off_js["node"]["cgroup"] == "v1/cgroupfs"


def test_bundle_layout(bundle: Path) -> None:
    root, keep = open_bundle(bundle)
    try:
        meta = root.meta
        assert meta["format"] == "gpuwarden.bundle/v1" and meta["captured_at"] > 1.7e9
        # a tree that is not this host's / is never named after the machine that collected it (issue 30)
        assert meta["node_name"] == os.environ.get("NODE_NAME", "")
        assert meta["stat"]["/dev/nvidiactl"]["kind"] == "chr"
        assert (meta["stat"]["/dev/nvidia-uvm"]["major"], meta["stat"]["/dev/nvidia-uvm"]["minor"]) == (238, 0)
        assert f"/proc/{PLUGIN_PID}/root/dev/nvidia0" in meta["stat"]
        assert meta["stat"]["/run/systemd/generator"]["mtime"] == RELOAD_AT  # stat only, for the reload's date
        assert "nvidia-uvm" not in meta["listdir"][f"/proc/{PLUGIN_PID}/root/dev"]
        assert "238 nvidia-uvm" in root.read_text("/proc/devices")
        assert root.read_text(f"/proc/{KUBELET_PID}/cmdline").startswith("/usr/bin/kubelet\0")
        assert "c 195:255 rw" in root.read_text(
            "/sys/fs/cgroup/devices/kubepods/besteffort/pod8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b/"
            f"{CID_GPU}/devices.list")
    finally:
        keep.cleanup()


def test_no_secrets_in_the_tarball(bundle: Path) -> None:
    with tarfile.open(bundle) as tf:
        members = tf.getmembers()
        names = [m.name for m in members]
        blobs = {m.name: tf.extractfile(m).read() for m in members if m.isfile()}
    assert not [n for n in names if "/var/run/secrets" in n or "/run/secrets" in n]
    for name, data in blobs.items():
        assert SECRET.encode() not in data, name
        assert TOKEN.encode() not in data, name
        assert b"AWS_SECRET_ACCESS_KEY" not in data, name
    # environ files hold only allow-listed variables
    kub_env = blobs.get(f"bundle/files/proc/{KUBELET_PID}/environ", b"")
    assert kub_env == b""
    assert blobs[f"bundle/files/proc/{PLUGIN_PID}/environ"].split(b"\0")[:2] == [b"PASS_DEVICE_SPECS=true",
                                                                                b"NVIDIA_VISIBLE_DEVICES=all"]
    assert blobs["bundle/files/proc/3400/environ"] == b"NVIDIA_VISIBLE_DEVICES=GPU-x\0"
    spec = json.loads(blobs[f"bundle/files{GPU_SPEC}"])
    assert spec["process"] == {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-517551a5-9054-f7d5-9cfb-b9575e192f6f",
                                       "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]}
    assert "mounts" not in spec
    assert [d["path"] for d in spec["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia0"]
    # every member stays under one top directory, no links or devices travel as tar entries
    assert all(n == "bundle" or n.startswith("bundle/") for n in names)
    assert all(m.isfile() or m.isdir() for m in members)


def test_open_bundle_rejects_escaping_members(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    import io

    with tarfile.open(evil, "w:gz") as tf:
        for name, data in (("bundle/meta.json", b"{}"), ("../../escape.txt", b"x")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    with pytest.raises(BundleError):
        open_bundle(evil, workdir=str(tmp_path))
    assert not (tmp_path.parent / "escape.txt").exists()
