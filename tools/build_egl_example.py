#!/usr/bin/env python3
"""Build the example node `egl-framebuffer-escape` from a bundle captured on the GPU machine.

The bundle is what `gpuwarden collect` wrote during the memory-egl scenario of tests/gpu/validate.py
(docs/validation.md): an H100 whose GPU memory a host process had filled with cudaMalloc, and a pod
viz/render-0 (memory.max 2 GiB) holding 64 EGL framebuffers of 4096x4096 that the driver had placed
in host RAM, charged to no cgroup. Everything is kept as captured except what is scrubbed:
the host name (and the node name derived from it), the path of the test checkout in command lines,
and the GPU's UUID. ORIGIN.md says so.

    python tools/build_egl_example.py BUNDLE.tar.gz   # rewrites src/gpuwarden/examples/egl-framebuffer-escape
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "src/gpuwarden/examples/egl-framebuffer-escape"
NODE = "gpu-h100-render"
APP = "/opt/render"
FAKE_UUID = "GPU-00000000-0000-4000-8000-00000000e91e"

DESCRIPTION = ("Incident 4 reproduced on an H100 (driver 580.159.04, kernel 6.18, cgroup v2): with the GPU's memory "
               "full, pod viz/render-0 (memory limit 2 GiB) holds 64 EGL framebuffers of 4096x4096 that the driver "
               "placed in host RAM: 6.9 GiB in no meminfo field and charged to no cgroup, while the pod's "
               "memory.current stays at 114 MiB. A real capture (`gpuwarden collect`), scrubbed.")


def scrub_text(text: str, uuid: str, host: str, checkout: str, *, node: str = NODE, app: str = APP,
               fake_uuid: str = FAKE_UUID) -> str:
    text = text.replace(checkout, app) if checkout else text
    text = text.replace(uuid, fake_uuid) if uuid else text
    return re.sub(rf"\b{re.escape(host)}\b", node, text) if host else text


def example_from_bundle(bundle: str, out: Path, *, node: str, app: str, fake_uuid: str, description: str,
                        origin: str, renames: dict[str, str] | None = None) -> None:
    """A captured bundle as the example directory `out`: its files and meta, scrubbed (host name, GPU
    UUID, the test checkout's path in command lines, then `renames` in that order), and ORIGIN.md."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(bundle) as tf:
            tf.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("*/meta.json")).parent
        meta = json.loads((src / "meta.json").read_text())
        host = (src / "files/proc/sys/kernel/hostname").read_text().strip()
        info = next((src / "files/proc/driver/nvidia/gpus").glob("*/information")).read_text()
        uuid = re.search(r"GPU UUID:\s*(\S+)", info).group(1)  # type: ignore[union-attr]
        cmdlines = [p.read_bytes().decode(errors="replace") for p in (src / "files/proc").glob("*/cmdline")]
        checkout = next((m.group(1) for c in cmdlines if (m := re.search(r"(/\S+?)/tests/gpu/", c))), "")

        def scrub(text: str) -> str:
            text = scrub_text(text, uuid, host, checkout, node=node, app=app, fake_uuid=fake_uuid)
            for old, new in (renames or {}).items():
                text = text.replace(old, new)
            return text

        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(src / "files", out / "files")
        for p in sorted((out / "files").rglob("*"), reverse=True):  # deepest first: renamed dirs stay valid
            if p.is_file():
                raw = p.read_bytes()
                try:
                    text = raw.decode()
                except UnicodeDecodeError:
                    continue
                new = scrub(text)
                if new != text:
                    p.write_bytes(new.encode())
            rel = "/" + str(p.relative_to(out / "files"))
            if scrub(rel) != rel:
                dest = out / "files" / scrub(rel).lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                p.rename(dest)
        meta["node_name"] = node
        meta["description"] = description
        (out / "meta.json").write_text(scrub(json.dumps(meta, indent=1, sort_keys=True)) + "\n")
        (out / "ORIGIN.md").write_text(origin)


def main(bundle: str) -> None:
    example_from_bundle(bundle, OUT, node=NODE, app=APP, fake_uuid=FAKE_UUID, description=DESCRIPTION,
                        origin=ORIGIN.format(description=DESCRIPTION, node=NODE, app=APP, uuid=FAKE_UUID),
                        renames={f"{APP}/tests/gpu/gl_worker.py": f"{APP}/render.py",
                                 f"{APP}/tests/gpu/gpu_fill.py": f"{APP}/fill.py"})
    print(OUT)


ORIGIN = """# Origin of the example node `egl-framebuffer-escape`

{description}

**Captured**, not built: `gpuwarden collect` ran on the GPU machine (NVIDIA H100 80GB HBM3, driver
580.159.04, kernel 6.18.44, cgroup v2, no kubelet or container runtime) in the `memory-egl` scenario of
`tests/gpu/validate.py` on 2026-11-24 (docs/validation.md, run 5). What a node would hold was laid out
for real by the scenario (`tests/gpu/podlayout.py`): the pod's and container's cgroups under
`kubepods.slice` with memory.max 2 GiB and a runc-shaped device program, containerd's task
`config.json` with the CRI annotations, kubelet's config and device-manager checkpoint. The processes
were real: `fill.py` (a host process holding 77 GiB of cudaMalloc, NVML type C) and the
pod's `render.py` (moderngl on the NVIDIA EGL vendor library, NVML type G) with its framebuffers.

**Scrubbed** by `tools/build_egl_example.py`: the host name (now `{node}`), the path of the test
checkout in command lines (now `{app}`, with the scripts renamed `render.py` and `fill.py`) and the
GPU UUID (now `{uuid}`). Environment variables were already reduced to the collector's allow-list.
Every number (meminfo, slabinfo, zoneinfo, vmstat, cgroup files, nvidia-smi's XML, the recorded NVML
probe) is as captured.

Expected: `gpuwarden check --example egl-framebuffer-escape` reports GPU-NODE-001 CONFIRMED critical for
pod viz/render-0 (named as the only graphics client on a full GPU), as the live host did.
"""

if __name__ == "__main__":
    main(sys.argv[1])
