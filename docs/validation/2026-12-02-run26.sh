#!/bin/bash
# GPU call 26 (issue 42): cri-hook-v2-update again after GPU-DEV-002 says LOW "not sure" when runc's version is unknown (carry: .whlc .gl .cache/cri-debs)
# limit containerd set (cri-memory-escape), the legacy hook's cgroup v2 program through the static CPU manager's
# update (cri-hook-v2-update), and Run 17's cri-update-keeps-devices again as the stack's regression. Leaves the
# CRI kit built in .cache/cri and the wheels in .cache/site for call B on the same (warm) machine.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $PWD/.cache/site .whlc/*.whl || exit 9
for d in .gl/*.deb; do dpkg -x "$d" /; done
ldconfig
export PYTHONPATH=$PWD/.cache/site:$PWD/src PYTHONUNBUFFERED=1 CRI_DEBS=$PWD/.cache/cri-debs GPUWARDEN_CACHE=$PWD/.cache
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv,noheader; }
{ q; uname -r; nproc; free -g | head -2; cat /sys/fs/cgroup/cgroup.controllers; cat /proc/sys/net/core/bpf_jit_harden;
  python3 -c 'import grpc, msgspec, moderngl; print(grpc.__version__, msgspec.__version__, moderngl.__version__)'; } > $OUT/env-before.txt 2>&1
echo "== validate $(date -u +%T)"
timeout 420 python3 tests/gpu/validate.py --out $OUT --only cri-hook-v2-update \
  > $OUT/validate.log 2>&1; echo "validate rc=$?"
grep -E '^\[(PASS|FAIL)\]|passed|fb ' $OUT/validate.log
python3 - "$OUT/validation.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["scenario"], "checks:", {k: v for k, v in (r.get("checks") or {}).items() if not v} or "all true", r.get("error", ""))
PY
cat .cache/cri/bin/VERSIONS
q > $OUT/env-after.txt 2>&1; diff <(cut -d, -f1-6 $OUT/env-before.txt | head -1) <(cut -d, -f1-6 $OUT/env-after.txt) && echo "GPU settings unchanged"
{ ps -eo pid,stat,comm | grep -E "containerd|runc|python|sleep" | grep -v grep; ls -d /run/containerd /sys/fs/cgroup/kubepods /var/lib/kubelet /var/run/cdi/* 2>&1; } > $OUT/left.txt; cat $OUT/left.txt
