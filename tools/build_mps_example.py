#!/usr/bin/env python3
"""Build the example node `mps-binary-missing-h100` from the bundle captured on the GPU machine.

The bundle is what `gpuwarden collect` wrote in the mps-binary-missing scenario of tests/gpu/validate.py
(tests/gpu/mps_scenarios.py, docs/validation.md): the device plugin's real MPS control daemon
crash-looping on an H100 whose driver nvidia-cuda-mps-control (and -server) were absent from the node's
view, a client pod running beside it. Kept as captured except what is scrubbed: the host name, the GPU
UUID, the test checkout's path in command lines and the scenario's temp paths. ORIGIN.md says so.

    python tools/build_mps_example.py BUNDLE.tar.gz   # rewrites src/gpuwarden/examples/mps-binary-missing-h100
    python tools/build_mps_example.py --fixture h100-mps-died-2026-11-24 BUNDLE.tar.gz   # tests/fixtures/captures/...

The healthy and died-mid-run states of the same scenarios are kept the same way as test fixtures
(tests/fixtures/captures/h100-mps-{healthy,died}-2026-11-24): the real state GPU-K8S-011's tests read.
"""

from __future__ import annotations

import sys
from pathlib import Path

from build_egl_example import example_from_bundle

REPO = Path(__file__).resolve().parents[1]
NAME = "mps-binary-missing-h100"
OUT = REPO / "src/gpuwarden/examples" / NAME
NODE = "gpu-h100-mps"
APP = "/opt/app"
FAKE_UUID = "GPU-00000000-0000-4000-8000-0000000005b0"
#: the scenario's unpacked daemon binary and temp files -> where the plugin image and a pod have them
RENAMES = {
    "/tmp/gw-mps/nvidia-device-plugin/48c919355d732b5b/mps-control-daemon": "/usr/bin/mps-control-daemon",
    f"{APP}/tests/gpu/mps_client.py": f"{APP}/mps_client.py",
    "/tmp/gw-mps/": "/tmp/",
}

DESCRIPTION = ("Incident 5b reproduced on an H100 (driver 580.159.04) with the device plugin's real MPS control "
               "daemon (v0.20.0): nvidia-cuda-mps-control and -server are gone from every directory of the daemon's "
               "PATH, the daemon logs the incident's line `Failed to start MPS daemon: exec: \"nvidia-cuda-mps-control\": "
               "executable file not found in $PATH`, exits 1 after its 30 s retry and is restarted; nothing of MPS runs. "
               "A real capture (`gpuwarden collect`), scrubbed.")

ORIGIN = f"""# Origin of the example node `{NAME}`

{DESCRIPTION}

**Captured**, not built: `gpuwarden collect` ran on the GPU machine (NVIDIA H100 80GB HBM3, driver
580.159.04, kernel 6.18.44, cgroup v2, no kubelet or container runtime) in the `mps-binary-missing`
scenario of `tests/gpu/validate.py` (`tests/gpu/mps_scenarios.py`) on 2026-11-24, run 4 of
docs/validation.md's issue-25 section. What a node would hold was laid out for real as the Helm chart
runs the `nvidia-device-plugin-mps-control-daemon` pod: its config (MPS sharing of nvidia.com/gpu,
4 replicas) in the ConfigMap and emptyDir volumes under /var/lib/kubelet/pods, the host MPS root
/run/nvidia/mps (its container's /mps), its pod log under /var/log/pods written line by line in the
CRI format from the daemon's real output (0.log: the first container, which exited 1 after 30.1 s;
1.log: its restart), and a client pod ml/mps-client-0 (a kubepods cgroup with a runc-shaped device
program, containerd's config.json, the device-manager checkpoint with its replica `<uuid>::0`),
whose CUDA ran without MPS (cuCtxCreate succeeded; nvidia-smi listed it as an ordinary GPU process).

"After the driver upgrade" is a mount namespace in which the driver's nvidia-cuda-mps-control and
nvidia-cuda-mps-server were absent from /usr/local/nvidia/bin, where this machine's driver keeps them,
and from /usr/bin and /bin, where it has small wrapper scripts of those names (overlays; the host's
files were not touched), so the daemon's exec found no such program, as after the incident's upgrade.
(Run 1 hid only the driver's copies: the wrappers exited 127; that capture is the test fixture
`h100-mps-exit127-2026-11-24`.) The daemon, the client and `gpuwarden collect` ran in that namespace, so the
capture's `/usr/local/nvidia/bin` listing lacks both. The daemon's `nvidia-smi -c EXCLUSIVE_PROCESS`
went to a recording stand-in (the shared GPU's settings never change), so the captured `nvidia-smi
-q -x` shows compute mode Default; on a real node the GPU would be left in EXCLUSIVE_PROCESS (the
stand-in recorded that call before each start and no `-c DEFAULT` after).

**Scrubbed** by `tools/build_mps_example.py`: the host name (now `{NODE}`), the GPU UUID (now
`{FAKE_UUID}`), the path of the test checkout in command lines (now `{APP}`), the scenario's
unpacked daemon binary (now `/usr/bin/mps-control-daemon`, its path in the plugin image) and its temp
directory. Environment variables were already reduced to the collector's allow-list. Everything else
(the daemon's log lines and their times, the MPS root's listings, nvidia-smi's XML, the process
table) is as captured.

Expected: `gpuwarden check --example {NAME}` reports GPU-K8S-007 CONFIRMED high, and nothing else at
medium or above: what the live node reported in run 4, from the same code (0.63 s).
"""


FIXTURES = {
    "h100-mps-healthy-2026-11-24": (
        "mps-healthy", 3, "The device plugin's real MPS control daemon running on an H100: the driver's "
        "nvidia-cuda-mps-control -d and an nvidia-cuda-mps-server, the client pod ml/mps-client-0 running CUDA "
        "through MPS (CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe). gpuwarden reported nothing, live and here."),
    "h100-mps-exit127-2026-11-24": (
        "mps-binary-missing", 1, "Run 1 of the same scenario: only the driver's nvidia-cuda-mps-control and -server were "
        "hidden; the wrapper scripts of those names in /usr/bin stayed and exited 127, so the daemon logged `Failed to "
        "start MPS daemon: exit status 127`. The collector of that run did not yet keep CUDA_MPS_PIPE_DIRECTORY in "
        "container env."),
    "h100-mps-died-2026-11-24": (
        "mps-daemon-died", 3, "The same, seconds after the MPS control daemon and server were killed (SIGKILL) under the "
        "running client: its next call failed with CUDA_ERROR_MPS_RPC_FAILURE (806); the plugin's daemon kept "
        "running, unaware; .started and the pid file stayed. gpuwarden reported GPU-K8S-011, live and here."),
}
FIXTURE_ORIGIN = """# Origin of the test fixture `{name}`

{description}

**Captured** by `gpuwarden collect` on the GPU machine (NVIDIA H100 80GB HBM3, driver 580.159.04, kernel
6.18.44) in the `{scenario}` scenario of `tests/gpu/validate.py` (`tests/gpu/mps_scenarios.py`), run {run} of
docs/validation.md's issue-25 section, laid out as the example `{example}` says (its ORIGIN.md). The
daemon's compute-mode calls went to a recording stand-in: the GPU stayed in Default.
**Scrubbed** by `tools/build_mps_example.py --fixture`: host name (`{node}`), GPU UUID (`{uuid}`), the test
checkout's path (`{app}`), the unpacked daemon binary (`/usr/bin/mps-control-daemon`) and temp paths.
"""


def main(argv: list[str]) -> None:
    if argv[0] == "--fixture":
        name, bundle = argv[1], argv[2]
        scenario, run, description = FIXTURES[name]
        out = REPO / "tests/fixtures/captures" / name
        origin = FIXTURE_ORIGIN.format(name=name, description=description, scenario=scenario, run=run, example=NAME,
                                       node=NODE, uuid=FAKE_UUID, app=APP)
        example_from_bundle(bundle, out, node=NODE, app=APP, fake_uuid=FAKE_UUID, description=description,
                            origin=origin, renames=RENAMES)
        print(out)
        return
    example_from_bundle(argv[0], OUT, node=NODE, app=APP, fake_uuid=FAKE_UUID, description=DESCRIPTION,
                        origin=ORIGIN, renames=RENAMES)
    print(OUT)


if __name__ == "__main__":
    main(sys.argv[1:])
