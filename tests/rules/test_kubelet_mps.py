"""GPU-K8S-001 (kubelet blocked by a hung device-plugin call), GPU-K8S-007 (MPS daemon cannot start), GPU-K8S-011 (MPS control daemon died)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpuwarden import engine
from gpuwarden.facts.probes import ProbeResults
from gpuwarden.findings import Severity, Status
from gpuwarden.probes.bounded import ChildResult
from tests.support.bundles import CAPTURED, FIXTURES, bundle, copy_example, example_root, facts_of, open_dir
from tests.support.kubelet_log import alloc, gpa, kline, noise, syncloop

UID6 = "69e0758e-d625-4013-9258-df8b7ddf04e2"
VERSION_570_158 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.158.01  Release Build  "
                   "(dvs-builder@U16-I3-B13-4-3)  Fri Jun  6 01:07:48 UTC 2025\n")
VERSION_570_172 = VERSION_570_158.replace("570.158.01", "570.172.08")
MIG = {"/proc/driver/nvidia/capabilities/gpu0/mig/gi1/access": "DeviceFileMinor: 12\nDeviceFileMode: 292\n"}
MPS_ERR = ('2025-08-05T16:40:16.431856992+08:00 stderr F E0805 08:40:16.431856 303 main.go:213] Failed to start MPS '
           'daemon: exec: "nvidia-cuda-mps-control": executable file not found in $PATH\n')
MPS_POD_DIR = ("/var/log/pods/gpu-operator_nvidia-device-plugin-mps-control-daemon-rpm7r_"
               "5b0d7c1e-2f43-4a8e-9c61-3d7e8f902a14/mps-control-daemon-ctr")
HUNG_LOG = (gpa("20:39:03.753013", 45878, UID6, "neal-0729-6") + noise("20:40:00.000000", 45878)
            + noise("21:02:03.804324", 45878))


def run(root, code: str, f=None):
    f = f or facts_of(root)
    rep = engine.run(f, engine.select(engine.all_rules(), (code,)), mode="bundle")
    assert rep.errors == [], rep.errors
    return rep


def found(root, code: str, f=None) -> list:
    return run(root, code, f).findings


def ev(f) -> list[str]:
    return [f"{e.source}: {e.text}" for e in f.evidence]


# --- GPU-K8S-001 ----------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-K8S-001", "positive")
def test_k8s001_confirmed_on_mig_nvml_hang() -> None:
    (f,) = found(example_root("mig-nvml-hang"), "GPU-K8S-001")
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    assert "waiting 25m56s for the device plugin's GetPreferredAllocation" in f.summary
    assert "mck-test/neal-0729-6-8686d45f8c-rgsr9 container neal-0729-6" in f.summary
    assert "2 pod add/delete(s) queued" in f.summary and "sync loop has been silent" in f.summary
    assert "Driver 570.158.01 with MIG is in the NVML-hang range" in f.summary
    lines = ev(f)
    assert lines[0] == ('/.gpuwarden/logs/kubelet.log: Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 '
                        '20:39:03.753013 45878 manager.go:956] "Issuing a GetPreferredAllocation call for container" '
                        'containerName="neal-0729-6" podUID="69e0758e-d625-4013-9258-df8b7ddf04e2"')
    assert "kept logging, with no Allocate, sync-loop or pod line after the call" in lines[1]
    assert any("Adding new pods from source" in x and "neal-0729-6-68b4895fb7-6868w" in x for x in lines)
    assert any(x.startswith("/proc/driver/nvidia/version: NVRM version") and "570.158.01" in x for x in lines)
    assert "/.gpuwarden/commands/nvidia-smi-q-x.xml: MIG enabled on 00000000:0F:00.0, 00000000:34:00.0, " \
           "00000000:48:00.0" in lines
    kinds = [(a.kind, a.name, a.namespace) for a in f.affected]
    assert kinds[0] == ("container", "neal-0729-6", "mck-test")
    assert ("pod", "neal-0729-6-68b4895fb7-6868w", "mck-test") in kinds
    assert f.data["driver_status"] == "affected" and f.data["syncloop_after"] == 0
    assert "upgrade to 570.172.08 or later" in f.remedy and "systemctl restart kubelet" in f.remedy
    assert "https://github.com/kubernetes/kubernetes/issues/130855" in f.references
    assert "https://github.com/NVIDIA/gpu-operator/issues/1361" in f.references


@pytest.mark.rule("GPU-K8S-001", "positive")
def test_k8s001_confirmed_from_real_journal_json(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"/.gpuwarden/logs/kubelet.journal.json":
                             (FIXTURES / "logs/incident5-journal/kubelet.journal.json").read_bytes()})
    (f,) = found(root, "GPU-K8S-001")
    assert f.status is Status.CONFIRMED and f.data["pod_uid"] == UID6
    assert f.data["queued"] == [{"op": "add", "pod": "mck-test/neal-0729-6-68b4895fb7-6868w"},
                                {"op": "delete", "pod": "mck-test/neal-0729-6-8686d45f8c-rgsr9"}]
    assert "driver_status" not in f.data  # no driver facts in this bundle: the log alone decides


@pytest.mark.rule("GPU-K8S-001", "positive")
def test_k8s001_at_risk_bad_driver_with_mig(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"/proc/driver/nvidia/version": VERSION_570_158, **MIG})
    (f,) = found(root, "GPU-K8S-001")
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH
    assert "Driver 570.158.01 is in the NVML-hang range (>=570.124.06, <=570.158.01)" in f.summary
    assert "MIG is enabled on 1 GPU(s); fixed in 570.172.08" in f.summary
    # (facts/driver.py names the GPU by the path's "mig" component rather than "gpu0": reported)
    assert any(x.startswith("/proc/driver/nvidia/capabilities/gpu*/mig: MIG enabled on ") for x in ev(f))


@pytest.mark.rule("GPU-K8S-001", "positive")
def test_k8s001_at_risk_high_on_nvml_probe_timeout(tmp_path: Path) -> None:
    """One probe timeout is gpuwarden's own deadline missed: at-risk, high, never critical (issue 32)."""
    root = bundle(tmp_path, {"/proc/driver/nvidia/version": VERSION_570_172})
    fa = facts_of(root)
    fa.set("probes", ProbeResults(ChildResult("timeout", 5.0, detail="nvmlInit did not return"), recorded=True))
    (f,) = found(root, "GPU-K8S-001", fa)
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH
    assert "The NVML probe did not answer in time" in f.summary
    assert "probe:nvml: NVML probe timed out after 5s: nvmlInit did not return" in ev(f)


SOCK = "/var/lib/kubelet/device-plugins/nvidia-gpu.sock"


def plugin_probe(*calls: tuple[str, str]) -> str:
    """probes.json as `collect` records it, with the plugin probe's calls (rpc, status) on one socket."""
    return json.dumps({"nvml": None, "plugin": {"status": "ok", "elapsed_s": 5.1, "detail": "", "value": [
        {"socket": SOCK, "calls": [{"rpc": r, "status": st, "elapsed_s": 5.0 if st == "timeout" else 0.002,
                                    "detail": "no answer within 5s (DEADLINE_EXCEEDED)" if st == "timeout" else "ok",
                                    "timeout_s": 5.0} for r, st in calls]}]}})


@pytest.mark.rule("GPU-K8S-001", "positive")
def test_k8s001_confirmed_on_a_plugin_probe_timeout(tmp_path: Path) -> None:
    """Incident 5a as the real NVIDIA plugin shows it: options and ListAndWatch answer, GetPreferredAllocation hangs."""
    probes = plugin_probe(("GetDevicePluginOptions", "ok"), ("ListAndWatch", "ok"), ("GetPreferredAllocation", "timeout"))
    root = bundle(tmp_path, {"/.gpuwarden/probes.json": probes, "/proc/driver/nvidia/version": VERSION_570_158, **MIG})
    (f,) = found(root, "GPU-K8S-001")
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    assert f.summary.startswith(f"The device plugin did not answer GetPreferredAllocation on {SOCK} within the probe's")
    assert "Driver 570.158.01 with MIG is in the NVML-hang range" in f.summary
    assert f"probe:plugin {SOCK}: GetPreferredAllocation: no answer within 5s (DEADLINE_EXCEEDED) (waited 5.0s)" in ev(f)
    assert f.data["hung_sockets"] == [SOCK] and f.data["source"] == "plugin probe"


@pytest.mark.rule("GPU-K8S-001", "negative")
def test_k8s001_silent_when_the_plugin_probe_answers(tmp_path: Path) -> None:
    probes = plugin_probe(("GetDevicePluginOptions", "ok"), ("ListAndWatch", "ok"), ("GetPreferredAllocation", "ok"))
    root = bundle(tmp_path, {"/.gpuwarden/probes.json": probes, "/proc/driver/nvidia/version": VERSION_570_172})
    assert found(root, "GPU-K8S-001") == []


@pytest.mark.rule("GPU-K8S-001", "positive")
def test_k8s001_at_risk_after_a_hang_ended_by_restart(tmp_path: Path) -> None:
    log = (gpa("20:39:03.753013", 45878, UID6, "c") + noise("20:50:00.000000", 45878)
           + kline("21:00:00.000000", 51000, "server.go:415", '"Kubelet version" kubeletVersion="v1.27.5"')
           + syncloop("21:00:02.000000", 51000))
    (f,) = found(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log}), "GPU-K8S-001")
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH
    assert "stayed pending 20m56s until the kubelet restarted" in f.summary
    assert any("Kubelet version" in x for x in ev(f))


@pytest.mark.rule("GPU-K8S-001", "negative")
def test_k8s001_silent_on_completed_admission(tmp_path: Path) -> None:
    log = (gpa("19:37:03.951749", 26361, UID6, "neal-0729-1") + alloc("19:37:03.952761", 26361)
           + syncloop("19:37:04.000000", 26361, "(PLEG): event for pod") + noise("21:02:03.000000", 26361))
    root = bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log,
                             "/proc/driver/nvidia/version": VERSION_570_172, **MIG})
    assert found(root, "GPU-K8S-001") == []


@pytest.mark.rule("GPU-K8S-001", "negative")
@pytest.mark.parametrize("version,mig", [(VERSION_570_172, True), (VERSION_570_158, False)])
def test_k8s001_no_at_risk_when_fixed_or_mig_off(tmp_path: Path, version: str, mig: bool) -> None:
    files = {"/proc/driver/nvidia/version": version, **(MIG if mig else {})}
    assert found(bundle(tmp_path, files), "GPU-K8S-001") == []


@pytest.mark.rule("GPU-K8S-001", "negative")
def test_k8s001_open_call_shorter_than_the_stall(tmp_path: Path) -> None:
    log = gpa("21:04:55.000000", 45878, UID6, "c") + noise("21:04:58.000000", 45878)
    assert found(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": log}), "GPU-K8S-001") == []


@pytest.mark.rule("GPU-K8S-001", "negative")
def test_k8s001_stall_threshold_is_a_setting() -> None:
    root = example_root("mig-nvml-hang")
    (f,) = found(root, "GPU-K8S-001", facts_of(root, plugin_call_stall_s=7200))
    assert f.status is Status.AT_RISK  # the driver risk remains; the 26-minute wait is under 2 h


@pytest.mark.rule("GPU-K8S-001", "negative")
def test_k8s001_silent_on_healthy() -> None:
    assert found(example_root("healthy"), "GPU-K8S-001") == []


def test_k8s001_not_evaluated_without_logs_or_driver(tmp_path: Path) -> None:
    rep = run(bundle(tmp_path, {"/etc/os-release": "x\n"}), "GPU-K8S-001")
    (s,) = rep.skipped
    assert s.code == "GPU-K8S-001" and "no kubelet, containerd, kernel or NVIDIA pod log" in s.reason
    assert "driver:" in s.reason


@pytest.mark.parametrize("garbage", [b"\x00\xff" * 5000, b"GetPreferredAllocation\n" * 3,
                                     HUNG_LOG.encode()[:100], b"I0730 99:99:99.000000 1 f.go:1] x\n"])
def test_k8s001_garbage_log_no_traceback(tmp_path: Path, garbage: bytes) -> None:
    rep = run(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": garbage}), "GPU-K8S-001")
    assert rep.skipped == [] and all(f.status is Status.CONFIRMED for f in rep.findings) is True
    assert [f for f in rep.findings if f.data.get("waited_s") is None] == []


def test_k8s001_log_ending_at_the_call_uses_the_capture_time(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": gpa("20:39:03.753013", 45878, UID6, "c")})
    (f,) = found(root, "GPU-K8S-001")
    assert f.status is Status.CONFIRMED and f.data["waited_s"] == pytest.approx(CAPTURED - 1753879143.753013)
    assert any("the log ends 0s after the call" in x for x in ev(f))


# --- GPU-K8S-007 ----------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_confirmed_on_mps_binary_missing() -> None:
    (f,) = found(example_root("mps-binary-missing"), "GPU-K8S-007")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.summary.startswith("The MPS control daemon cannot start: exec of nvidia-cuda-mps-control fails (2 time(s)")
    assert "absent from /usr/bin while nvidia-smi is there" in f.summary
    assert "8 GPU(s) left in Exclusive_Process" in f.summary
    lines = ev(f)
    assert any(x.endswith('main.go:213] Failed to start MPS daemon: exec: "nvidia-cuda-mps-control": executable '
                          'file not found in $PATH') for x in lines)
    assert "/usr/bin/nvidia-cuda-mps-control: absent (nvidia-smi present in /usr/bin)" in lines
    assert [(a.kind, a.name, a.namespace, a.detail) for a in f.affected] == [
        ("container", "mps-control-daemon-ctr", "gpu-operator", "pod nvidia-device-plugin-mps-control-daemon-rpm7r")]
    assert "apt-get install nvidia-compute-utils-570" in f.remedy


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_confirmed_from_the_kubelet_log(tmp_path: Path) -> None:
    # older manifests exec the binary as the container command: the runtime error lands in kubelet's log
    line = kline("08:40:16.500000", 1200, "pod_workers.go:1300", '"Error syncing pod, skipping" err="failed to '
                 '\\"StartContainer\\" for \\"mps-control-daemon-ctr\\" with RunContainerError: \\"failed to create '
                 'containerd task: OCI runtime create failed: runc create failed: unable to start container process: '
                 'exec: \\\\\\"nvidia-cuda-mps-control\\\\\\": executable file not found in $PATH: unknown\\""', sev="E")
    (f,) = found(bundle(tmp_path, {"/.gpuwarden/logs/kubelet.log": line}), "GPU-K8S-007")
    assert f.status is Status.CONFIRMED and f.affected[0].kind == "plugin"


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_confirmed_when_configured_and_binary_absent(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"/etc/kubernetes/node-feature-discovery/features.d/gfd":
                             "nvidia.com/gpu.product=NVIDIA-H20\nnvidia.com/mps.capable=true\n",
                             "/usr/bin/nvidia-smi": "ELF"})
    (f,) = found(root, "GPU-K8S-007")
    assert f.status is Status.CONFIRMED
    assert "MPS is configured on this node but nvidia-cuda-mps-control is absent from /usr/bin" in f.summary
    assert "/etc/kubernetes/node-feature-discovery/features.d/gfd: nvidia.com/mps.capable=true" in ev(f)


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_configured_by_plugin_config(tmp_path: Path) -> None:
    cfg = ("version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n")
    root = bundle(tmp_path, {"/var/lib/kubelet/pods/1a2b/volumes/kubernetes.io~configmap/device-plugin-config/"
                             "mps.yaml": cfg, "/run/nvidia/driver/usr/bin/nvidia-smi": "ELF"})
    (f,) = found(root, "GPU-K8S-007")
    assert "/run/nvidia/driver/usr/bin" in f.summary
    assert any("sharing.mps.resources: nvidia.com/gpu x4" in x for x in ev(f))


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_at_risk_when_binary_is_back(tmp_path: Path) -> None:
    root = bundle(tmp_path, {f"{MPS_POD_DIR}/3.log": MPS_ERR, "/usr/bin/nvidia-smi": "ELF",
                             "/usr/bin/nvidia-cuda-mps-control": "ELF"})
    (f,) = found(root, "GPU-K8S-007")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM and "restart the MPS daemon pod" in f.summary


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_at_risk_exclusive_process_without_daemon(tmp_path: Path) -> None:
    b = copy_example("mps-binary-missing", tmp_path)
    for p in (b / "files/var/log/pods").iterdir():
        __import__("shutil").rmtree(p)
    (b / "files/usr/bin").mkdir(parents=True, exist_ok=True)
    (b / "files/usr/bin/nvidia-cuda-mps-control").write_text("ELF")
    meta = json.loads((b / "meta.json").read_text())
    meta["missing"] = {}
    (b / "meta.json").write_text(json.dumps(meta))
    (f,) = found(open_dir(b), "GPU-K8S-007")  # healthy's /proc lists processes: no nvidia-cuda-mps-*
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM
    assert "8 GPU(s) are in Exclusive_Process compute mode but no MPS daemon runs" in f.summary


@pytest.mark.rule("GPU-K8S-007", "negative")
def test_k8s007_silent_on_healthy_and_mig_hang() -> None:
    assert found(example_root("healthy"), "GPU-K8S-007") == []
    assert found(example_root("mig-nvml-hang"), "GPU-K8S-007") == []


@pytest.mark.rule("GPU-K8S-007", "negative")
def test_k8s007_silent_when_mps_not_configured_or_binary_present(tmp_path: Path) -> None:
    # binary absent, but nothing says MPS is used
    assert found(bundle(tmp_path / "a", {"/usr/bin/nvidia-smi": "ELF"}), "GPU-K8S-007") == []
    # configured, binary present
    root = bundle(tmp_path / "b", {"/etc/kubernetes/node-feature-discovery/features.d/gfd": "nvidia.com/mps.capable=true\n",
                                   "/usr/bin/nvidia-smi": "ELF", "/usr/bin/nvidia-cuda-mps-control": "ELF"})
    assert found(root, "GPU-K8S-007") == []


@pytest.mark.rule("GPU-K8S-007", "negative")
def test_k8s007_exclusive_mode_with_a_running_daemon_is_fine(tmp_path: Path) -> None:
    b = copy_example("mps-binary-missing", tmp_path)
    import shutil

    shutil.rmtree(b / "files/var/log/pods")
    (b / "files/usr/bin").mkdir(parents=True, exist_ok=True)
    (b / "files/usr/bin/nvidia-cuda-mps-control").write_text("ELF")
    (b / "files/proc/4242").mkdir(parents=True)
    (b / "files/proc/4242/cmdline").write_bytes(b"nvidia-cuda-mps-control\0-d\0")  # as collect captures it
    meta = json.loads((b / "meta.json").read_text())
    meta["missing"] = {}
    (b / "meta.json").write_text(json.dumps(meta))
    assert found(open_dir(b), "GPU-K8S-007") == []


def test_k8s007_garbage_pod_log(tmp_path: Path) -> None:
    rep = run(bundle(tmp_path, {f"{MPS_POD_DIR}/1.log": b"\x00\xff" * 1000 + MPS_ERR.encode()[:50]}), "GPU-K8S-007")
    assert rep.findings == [] and rep.skipped == []


# --- incident 5b captured on an H100 (mps-binary-missing-h100), GPU-K8S-011 ---------------------------

H100 = "mps-binary-missing-h100"
RES = "/run/nvidia/mps/nvidia.com/gpu"


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_on_the_captured_h100_node_exec_not_found_and_the_empty_pipe() -> None:
    """The example: run 4's capture, the incident's own line, as the live node reported it."""
    (f,) = found(example_root(H100), "GPU-K8S-007")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.summary.startswith("The MPS control daemon cannot start: exec of nvidia-cuda-mps-control fails "
                                "(3 time(s), last at 2026-11-24 11:59:44Z); 1 MPS client container(s) run without MPS "
                                "(ml/mps-client-0/cuda)")
    lines = ev(f)
    assert [x.rsplit("] ", 1)[-1] for x in lines[:1]] == [
        'Failed to start MPS daemon: exec: "nvidia-cuda-mps-control": executable file not found in $PATH']
    assert "/mps-control-daemon-ctr/1.log" in lines[0]
    assert f"{RES}/pipe: empty: no control socket, no nvidia-cuda-mps-control.pid, no .started" \
           " (the MPS control daemon never started for this resource)" in lines
    assert f.data["daemon_running"] is False
    assert found(example_root(H100), "GPU-K8S-011") == []


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_on_the_captured_h100_node_exit_127_and_the_empty_pipe() -> None:
    """Run 1's capture: the driver's wrappers left in /usr/bin exit 127."""
    (f,) = found(open_dir(EXIT127_MPS), "GPU-K8S-007")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.summary.startswith("The MPS control daemon cannot start: nvidia-cuda-mps-control exits 127 (found on "
                                "PATH, but what it runs is gone) (2 time(s), last at 2026-11-24 11:12:37Z)")
    lines = ev(f)
    assert [x.rsplit("] ", 1)[-1] for x in lines[:2]] == ["Failed to start MPS daemon: exit status 127"] * 2
    assert "/mps-control-daemon-ctr/1.log" in lines[0] and "/mps-control-daemon-ctr/0.log" in lines[1]
    assert f"{RES}/pipe: empty: no control socket, no nvidia-cuda-mps-control.pid, no .started" \
           " (the MPS control daemon never started for this resource)" in lines
    assert f.data["exit_127"] == 2 and f.data["daemon_running"] is False
    assert found(open_dir(EXIT127_MPS), "GPU-K8S-011") == []


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_names_mps_clients_that_run_without_mps(tmp_path: Path) -> None:
    """A container whose env has CUDA_MPS_PIPE_DIRECTORY for a resource whose daemon never started."""
    b = copy_example(H100, tmp_path)
    cfg = next((b / "files/run/containerd/io.containerd.runtime.v2.task/k8s.io").glob("*/config.json"))
    doc = json.loads(cfg.read_text())
    doc["process"]["env"].append("CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe")
    cfg.write_text(json.dumps(doc))
    (f,) = found(open_dir(b), "GPU-K8S-007")
    assert "1 MPS client container(s) run without MPS (ml/mps-client-0/cuda)" in f.summary
    assert ("container", "cuda", "ml") in {(a.kind, a.name, a.namespace) for a in f.affected}


CAPTURES = Path(__file__).resolve().parents[1] / "fixtures/captures"
HEALTHY_MPS = CAPTURES / "h100-mps-healthy-2026-11-24"  # real captures (tools/build_mps_example.py --fixture)
DIED_MPS = CAPTURES / "h100-mps-died-2026-11-24"
EXIT127_MPS = CAPTURES / "h100-mps-exit127-2026-11-24"


@pytest.mark.rule("GPU-K8S-011", "positive")
def test_k8s011_on_the_captured_h100_node_whose_control_daemon_was_killed() -> None:
    (f,) = found(open_dir(DIED_MPS), "GPU-K8S-011")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.summary == ("The MPS control daemon for nvidia.com/gpu (pid 1531) is gone while nvidia-device-plugin/"
                         "nvidia-device-plugin-mps-control-daemon-gw7xq still reports it started; 1 MPS client "
                         "container(s) (ml/mps-client-0/cuda) lost their MPS server: their CUDA calls fail "
                         "(CUDA_ERROR_MPS_RPC_FAILURE).")
    lines = ev(f)
    assert f"{RES}/pipe/nvidia-cuda-mps-control.pid: 1531: no nvidia-cuda-mps-control process runs on the node" in lines
    assert any(x.startswith(f"{RES}/log/control.log: last line: [2026-11-24 ") and "NEW CLIENT" in x for x in lines)
    assert any(x.endswith("/config.json: CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe") for x in lines)
    assert {(a.kind, a.name) for a in f.affected} == {("plugin", "mps-control-daemon"), ("container", "cuda")}
    # told apart from a daemon that never started
    assert found(open_dir(DIED_MPS), "GPU-K8S-007") == []


@pytest.mark.rule("GPU-K8S-011", "negative")
def test_k8s011_silent_on_the_healthy_mps_node_and_while_a_control_daemon_runs(tmp_path: Path) -> None:
    assert found(open_dir(HEALTHY_MPS), "GPU-K8S-011") == [] and found(open_dir(HEALTHY_MPS), "GPU-K8S-007") == []
    b = tmp_path / "died"
    shutil.copytree(DIED_MPS, b)
    (b / "files/proc/4242").mkdir(parents=True)
    (b / "files/proc/4242/cmdline").write_bytes(b"nvidia-cuda-mps-control\0-d\0")  # one runs again
    assert found(open_dir(b), "GPU-K8S-011") == []
    for name in ("healthy", "mps-binary-missing", H100):
        assert found(example_root(name), "GPU-K8S-011") == []


def test_the_healthy_mps_capture_has_nothing_at_medium_or_above() -> None:
    rep = engine.run(facts_of(open_dir(HEALTHY_MPS)), engine.all_rules(), mode="bundle")
    assert [f.code for f in rep.findings if f.severity >= Severity.MEDIUM] == []
