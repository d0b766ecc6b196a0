#!/usr/bin/env python3
"""Build the example node `mps-binary-missing-h100` from the bundle captured on the GPU machine.

The bundle is what `gpuwarden collect` wrote in the mps-binary-missing scenario of tests/gpu/validate.py
(tests/gpu/mps_scenarios.py, docs/validation.md): the device plugin's real MPS control daemon
crash-looping on an H100 whose nvidia-cuda-mps-control (and -server) were absent from the node's view, an
MPS client pod running beside it. Kept as captured except what is scrubbed: the host name, the GPU
UUID, the test checkout's path in command lines and the scenario's temp paths. ORIGIN.md says so.

    python tools/build_mps_example.py BUNDLE.tar.gz   # rewrites src/gpuwarden/examples/mps-binary-missing-h100
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
               "daemon (v0.20.0): nvidia-cuda-mps-control is gone from the node, the daemon logs `exec: "
               "\"nvidia-cuda-mps-control\": executable file not found in $PATH`, exits 1 after its 30 s retry and is "
               "restarted; the MPS client pod ml/mps-client-0 runs without MPS. A real capture (`gpuwarden "
               "collect`), scrubbed.")

ORIGIN = f"""# Origin of the example node `{NAME}`

{DESCRIPTION}

**Captured**, not built: `gpuwarden collect` ran on the GPU machine (NVIDIA H100 80GB HBM3, driver
580.159.04, kernel 6.18.44, cgroup v2, no kubelet or container runtime) in the `mps-binary-missing`
scenario of `tests/gpu/validate.py` (`tests/gpu/mps_scenarios.py`) on 2026-11-24 (docs/validation.md,
issue 25). What a node would hold was laid out for real as the Helm chart runs the
`nvidia-device-plugin-mps-control-daemon` pod: its config (MPS sharing of nvidia.com/gpu, 4 replicas)
in the ConfigMap and emptyDir volumes under /var/lib/kubelet/pods, the host MPS root /run/nvidia/mps
(its container's /mps), its pod log under /var/log/pods written line by line in the CRI format from the
daemon's real output (0.log: the first container, which exited 1; 1.log: its restart), and an MPS
client pod (a kubepods cgroup with a runc-shaped device program, containerd's config.json with
`CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe` as the plugin's Allocate sets it, the
device-manager checkpoint with its replica `<uuid>::0`).

"After the driver upgrade" is a mount namespace in which nvidia-cuda-mps-control and
nvidia-cuda-mps-server were absent from every directory of the daemon's PATH (overlays; the host's
files were not touched). The daemon, the client and `gpuwarden collect` ran in it, so the capture's
`/usr/bin` and `/usr/local/nvidia/bin` listings lack both. The daemon's `nvidia-smi -c
EXCLUSIVE_PROCESS` went to a recording stand-in (the shared GPU's settings never change), so the
captured `nvidia-smi -q -x` shows compute mode Default; on a real node the GPU would be left in
EXCLUSIVE_PROCESS (the stand-in recorded that call before each start and no `-c DEFAULT` after).

**Scrubbed** by `tools/build_mps_example.py`: the host name (now `{NODE}`), the GPU UUID (now
`{FAKE_UUID}`), the path of the test checkout in command lines (now `{APP}`), the scenario's
unpacked daemon binary (now `/usr/bin/mps-control-daemon`, its path in the plugin image) and its temp
directory. Environment variables were already reduced to the collector's allow-list. Everything else
(the daemon's log lines and their times, the MPS root's listings, nvidia-smi's XML, the process
table) is as captured.

Expected: `gpuwarden check --example {NAME}` reports GPU-K8S-007 CONFIRMED high, as the live
node did in the same run (docs/validation.md).
"""


def main(bundle: str) -> None:
    example_from_bundle(bundle, OUT, node=NODE, app=APP, fake_uuid=FAKE_UUID, description=DESCRIPTION,
                        origin=ORIGIN, renames=RENAMES)
    print(OUT)


if __name__ == "__main__":
    main(sys.argv[1])
