#!/bin/bash
# GPU call B for issue 42 (carry: .cache/dra, 30.8 MB, 45.6 MB with the tree: the DRA plugin's .xz and SHA256SUMS, testapiserver.xz,
# etcd.xz), on the machine call A left warm (its .cache/cri and .cache/site): the real DRA kubelet plugin's claims
# through containerd's own CDI handling (cri-dra-healthy, cri-dra-stale-major, cri-dra-uvm-missing, cri-dra-teardown).
set -u
[ -f .cache/cri/bin/.stamp ] && [ -d .cache/site ] || { echo "call A did not run on this machine (no .cache/cri or .cache/site)"; exit 8; }
mkdir -p /tmp/gwdra
xz -dc .cache/dra/testapiserver.xz > /tmp/gwdra/testapiserver && chmod +x /tmp/gwdra/testapiserver || exit 9
command -v etcd >/dev/null || { xz -dc .cache/dra/etcd.xz > /tmp/gwdra/etcd && chmod +x /tmp/gwdra/etcd; }
export PATH=/tmp/gwdra:$PATH PYTHONPATH=$PWD/.cache/site:$PWD/src PYTHONUNBUFFERED=1 GPUWARDEN_CACHE=$PWD/.cache \
  GPUWARDEN_TESTAPISERVER=/tmp/gwdra/testapiserver GPUWARDEN_DRA_PLUGIN=$PWD/.cache/dra GW_DRA_AUTHZ=0
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv,noheader; }
{ q; etcd --version | head -1; grep -E "nvidia" /proc/devices; } > $OUT/env-before.txt 2>&1
echo "== validate $(date -u +%T)"
timeout 400 python3 tests/gpu/validate.py --out $OUT --only cri-dra-healthy cri-dra-stale-major cri-dra-uvm-missing \
  cri-dra-teardown > $OUT/validate.log 2>&1; echo "validate rc=$?"
grep -E '^\[(PASS|FAIL)\]|passed' $OUT/validate.log
python3 - "$OUT/validation.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    c = r.get("claim") or {}
    print(r["scenario"], "checks:", {k: v for k, v in (r.get("checks") or {}).items() if not v} or "all true",
          "attempts:", [a.get("how") + (": " + a["error"][-160:] if "error" in a else "") for a in c.get("attempts", [])],
          "worker:", r.get("worker"), r.get("error", ""))
PY
q > $OUT/env-after.txt 2>&1; diff <(cut -d, -f1-6 $OUT/env-before.txt | head -1) <(cut -d, -f1-6 $OUT/env-after.txt) && echo "GPU settings unchanged"
{ ps -eo pid,stat,comm | grep -E "containerd|runc|gpu-kubelet|testapiserver|etcd|python" | grep -v grep; ls -d /run/containerd /sys/fs/cgroup/kubepods /var/lib/kubelet /var/run/cdi/* 2>&1; } > $OUT/left.txt; cat $OUT/left.txt
