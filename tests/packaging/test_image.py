"""The container image, built from ./Dockerfile and run under real OCI runtimes (runc, crun).

Built without a Docker engine or a registry by tools/image/build.sh (buildah over a Debian base
made with mmdebstrap), unpacked with umoci. The example check in the container must give the
report the checkout gives; the agent must start under the securityContext the DaemonSet declares
(deploy/manifests/gpuwarden.yaml: user, capabilities, read-only root) with the ConfigMap's
agent.yaml, answer /healthz and /metrics, and stop cleanly on SIGTERM. Where this machine cannot
build or run the image (not root, no apt), the tests skip with the reason.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from tests.support import oci
from tests.support import dist
from tests.support.dist import REPO

pytestmark = pytest.mark.image
MANIFEST = REPO / "deploy/manifests/gpuwarden.yaml"


@pytest.fixture(scope="session")
def image(tmp_path_factory) -> oci.Image:
    try:
        ref = oci.build()
        return oci.Image.unpack(ref, tmp_path_factory.mktemp("image") / "bundle")
    except oci.ImageUnavailable as e:
        pytest.skip(f"CONTAINER IMAGE NOT BUILT: {e}")


def daemonset() -> tuple[dict, dict]:
    """(the agent container, the ConfigMap) as the plain manifests declare them."""
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    return ds["spec"]["template"]["spec"]["containers"][0], cm


@pytest.mark.parametrize("runtime", oci.RUNTIMES)
def test_example_check_in_the_container_is_the_check_outside(image, runtime, tmp_path) -> None:
    c = oci.Container(runtime, image.spec(["check", "--example", "uvm-missing", "--format", "json"]), tmp_path)
    try:
        p = c.run(timeout=120)
    except oci.ImageUnavailable as e:
        pytest.skip(str(e))
    assert p.returncode == 1, p.stderr  # a high finding
    inside = json.loads(p.stdout)
    outside = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--example", "uvm-missing", "--format",
                              "json"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert dist.stable(inside) == dist.stable(json.loads(outside.stdout))
    assert [f["code"] for f in inside["findings"]] == ["GPU-DEV-001"]


def test_every_example_ships_in_the_image(image) -> None:
    site = next(image.rootfs.glob("opt/gpuwarden/lib/python3*/site-packages/gpuwarden"))
    src = REPO / "src/gpuwarden/examples"
    want = {str(p.relative_to(src)) for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    got = {str(p.relative_to(site / "examples")) for p in (site / "examples").rglob("*")
           if p.is_file() and "__pycache__" not in p.parts}
    assert want <= got, sorted(want - got)[:10]


def test_agent_starts_under_the_daemonsets_security_context(image, tmp_path) -> None:
    container, cm = daemonset()
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    conf = tmp_path / "config"
    conf.mkdir()
    (conf / "agent.yaml").write_text(cm["data"]["agent.yaml"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the DaemonSet's own args (its --config, the ConfigMap mounted read-only where it says), plus
    # what lets it run here: a built-in example node instead of /host, no API server
    args = [*container["args"], "--example", "uvm-missing", "--no-kube", "--listen", f"127.0.0.1:{port}",
            "--interval", "1s", "--log-format", "json"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "config")
    spec = image.spec(args, user=sc.get("runAsUser", 0), caps=sc["capabilities"]["add"],
                      readonly=sc["readOnlyRootFilesystem"], binds={mount: str(conf)}, host_network=True)
    c = oci.Container("runc", spec, tmp_path)
    out, err = (tmp_path / "stdout").open("w+"), (tmp_path / "stderr").open("w+")
    c.start(out, err)
    try:
        status, body = oci.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        assert status == 200, body
        status, metrics = oci.wait_http(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert status == 200 and "gpuwarden_" in metrics
    finally:
        rc = c.stop()
    err.seek(0)
    log = err.read()
    assert rc == 0, log[-2000:]
    assert "Traceback" not in log and '"agent-stopped"' in log
    assert "Read-only file system" not in log


def test_image_runs_as_the_manifests_say_without_writing_its_root(image, tmp_path) -> None:
    """A check under the read-only root with every capability dropped still works (the check pod's case)."""
    spec = image.spec(["check", "--example", "mig-nvml-hang", "--termination-message", "/dev/null"],
                      caps=[], readonly=True)
    p = oci.Container("runc", spec, tmp_path).run(timeout=120)
    assert p.returncode == 1 and "GPU-K8S-001" in p.stdout, p.stderr


def test_the_check_pods_command_checks_the_host_from_the_image(image, tmp_path) -> None:
    """What `kubectl gpuwarden check` runs on a node: its pod's command, mounts and host PID, for real.

    The pod spec comes from gpuwarden.kubectl.checkpod; this machine is the node (no GPU: the
    check runs every rule on a live root all the same). The report on stdout and the one packed in
    the termination message (what the plugin reads back) must agree.
    """
    from gpuwarden.kubectl.checkpod import pod_manifest
    from gpuwarden.render.packed import unpack
    from tests.support.minischema import validate

    pod = pod_manifest("this-node", "gpuwarden", image="local")
    c = pod["spec"]["containers"][0]
    assert c["command"] == image.entrypoint()
    host = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
    binds = {m["mountPath"]: host[m["name"]] for m in c["volumeMounts"] if m["name"] in host}
    term = tmp_path / "termination-log"
    term.write_text("")
    (tmp_path / "tmp").mkdir()
    caps = oci.privileged_caps() if c["securityContext"]["privileged"] else []
    spec = image.spec(c["args"], caps=caps, readonly=c["securityContext"]["readOnlyRootFilesystem"], binds=binds,
                      writable={c["terminationMessagePath"]: str(term), "/tmp": str(tmp_path / "tmp")},
                      host_pid=pod["spec"]["hostPID"], host_network=pod["spec"]["hostNetwork"])
    p = oci.Container("runc", spec, tmp_path).run(timeout=120)
    assert p.returncode in (0, 1, 4), p.stderr[-2000:]  # 4: not checked (this host has no NVIDIA GPU)
    assert "Traceback" not in p.stderr
    report = json.loads(p.stdout)
    validate(report, json.loads((REPO / "docs/report-schema.json").read_text()))
    assert report["mode"] == "live" and report["summary"]["rules_run"] > 0
    assert report["node"]["hostname"] == socket.gethostname()  # the node's name, not the container's
    packed = unpack(term.read_text())
    assert packed is not None
    if packed.get("packed") == "reduced":
        assert [f["code"] for f in packed["findings"]] == [f["code"] for f in report["findings"]][:len(packed["findings"])]
    else:
        assert packed == report
