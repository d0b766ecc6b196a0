"""Records incidents 2/3's mechanism through real containerd + runc on a cgroup v1 host (root):
each device-list form's GPU rules before and after the static CPU manager's UpdateContainerResources,
and gpuwarden's verdict on the node with today's runc and with runc 1.0.0-rc92's version.

    sudo .venv/bin/python tools/cri/record_v1.py > docs/validation/<date>-cri-devhost-v1.json

The same matrix is asserted by tests/interop/test_cri_runtime.py; this writes it down.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import cri, cri_node as cn  # noqa: E402


def main() -> int:
    reason = cn.why_not()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    bin_dir = cri.build()
    work = Path(tempfile.mkdtemp(prefix="gw-cri-"))
    ver = cri.versions(bin_dir)
    node = cn.Node(work, ver["runc"] + "\n")
    node.write_cdi_spec(with_uvm=True)
    top = f"gpuwarden-cri-{os.getpid()}"
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "kernel": platform.release(),
                 "versions": ver, "cgroup": cri.cgroup_mode(), "forms": {}}
    try:
        with cri.Containerd(bin_dir, work / "containerd", node.cdi_dir) as c:
            k = cri.Kubelet(c.sock)
            for f in cn.FORMS:
                p = cn.create_form(k, node, f, top, f"gpu-{f}")
                before = cn.gpu_rules(p["cgroup"])
                k.update_cpuset(p["id"], "0")
                after = cn.gpu_rules(p["cgroup"])
                cfg = json.loads((c.state / "io.containerd.runtime.v2.task/k8s.io" / p["id"] / "config.json").read_text())
                out["forms"][f] = {
                    "devices.list GPU rules after start": before, "after UpdateContainerResources(cpuset=0)": after,
                    "kept": before == after,
                    "cpuset.cpus": Path("/sys/fs/cgroup/cpuset", p["cgroup"], "cpuset.cpus").read_text().strip(),
                    "config.json linux.devices": [d["path"] for d in (cfg["linux"].get("devices") or [])]}
            rep = cn.check(node, c.state, top)
            out["gpuwarden check (static CPU manager, runc 1.3.6)"] = [(f["code"], f["status"]) for f in rep["findings"]]
            node.set_runc("runc version 1.0.0-rc92\n")
            rep = cn.check(node, c.state, top)
            out["gpuwarden check, the same node with runc-version.txt saying 1.0.0-rc92"] = [
                (f["code"], f["status"], [a["name"] for a in f["affected"]]) for f in rep["findings"]]
            k.close()
    finally:
        cri.remove_cgroups(top)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
