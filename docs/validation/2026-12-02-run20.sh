#!/bin/bash
# GPU call for issue 41 (run 20): the two latency classes not yet measured on the GPU host, the three tree
# classes again, and idle on / with every source up. One call, under 7 minutes (each step has its own limit:
# 20 + 170 + 120 + 90 s at most; 3 min 42 s in the dry run on the CPU machine, 2 cores at load 11); the bench prints a line per
# run as it ends and rewrites its JSON after each, and a run stuck past 40 s is reported as a timeout with
# its state (the bench exits 3 if it is still stuck 20 s later).
#   - nvml-lost: the NVML event source alone, over tools/gpu/nvml_inject_shim.c linked against the host's
#     libnvidia-ml.so.1 (every call the driver's; the wait is the real one in 20 ms slices, answering
#     NVML_ERROR_GPU_IS_LOST once a trigger file exists: nothing reaches the GPU);
#   - pod-rejected: the pods watch on the real test API server (carried in .api/, xz, SHA-256 checked), a real
#     taint PATCH there;
#   - xid79, uvm-removed, plugin-socket-gone: on node trees, as run 19a (never the live kernel log: no --live);
#   - idle: bench/wake_idle.py --root / for one minute with the sources on (kmsg, inotify, psi, nvml).
# Nothing writes to the host's kernel log; no GPU setting is changed (checked before and after).
# Carry: .whl .api (made by docs/validation/2026-12-02-run20-carry.sh). Output: 7 files in $OUT.
# DRY=1 (the CPU machine): no wheel install (the caller's python and packages, PY=...), the stand-in NVML
# of tests/wake for the idle run's NVML source; nvml-lost picks the stand-in itself where there is no driver.
set -u
PY=${PY:-python3}
if [ -z "${DRY:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD
else
  export PYTHONPATH=$PWD/src:$PWD
  gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o /tmp/run20-fake-nvml.so tests/wake/nvml_events_fake.c || exit 7
  export GPUWARDEN_NVML_LIBRARY=/tmp/run20-fake-nvml.so
fi
export PYTHONUNBUFFERED=1
# the test API server and etcd: decompressed to /tmp/api and checked against .api/SHA256SUMS
mkdir -p /tmp/api
for b in testapiserver etcd; do
  $PY -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    .api/$b.xz /tmp/api/$b && chmod 755 /tmp/api/$b
done
(cd /tmp/api && sha256sum -c "$OLDPWD/.api/SHA256SUMS") || echo "API server binaries missing or not matching: pod-rejected will say not run"
export GPUWARDEN_TESTAPISERVER=/tmp/api/testapiserver PATH=/tmp/api:$PATH
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv,noheader; }
{ echo "before $(date -u +%T)"; q; uname -r; nproc; $PY -V
  $PY -c 'import grpc, msgspec, kubernetes; print("grpc", grpc.__version__, "msgspec", msgspec.__version__, "kubernetes", kubernetes.__version__)'
  command -v gcc etcd; ldconfig -p | grep "libnvidia-ml.so.1 "; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
L="$PY bench/event_latency.py --runs 10 --deadline 40 --grace 20"
echo "== nvml-lost, pod-rejected $(date -u +%T)"
timeout 170 $L --class-budget 60 --classes nvml-lost,pod-rejected --out $OUT/latency-a.json 2>&1 | tee $OUT/latency-a.log | cut -c1-600
echo "latency-a rc=${PIPESTATUS[0]}"
echo "== xid79, uvm-removed, plugin-socket-gone $(date -u +%T)"
timeout 120 $L --class-budget 35 --classes xid79,uvm-removed,plugin-socket-gone --out $OUT/latency-b.json 2>&1 | tee $OUT/latency-b.log | cut -c1-400
echo "latency-b rc=${PIPESTATUS[0]}"
echo "== idle, sources on, 1 min $(date -u +%T)"
timeout 90 $PY bench/wake_idle.py --root / --minutes 1.0 --modes on --out $OUT/idle.json > $OUT/idle.log 2>&1; echo "idle rc=$?"
cat $OUT/idle.log
$PY -c "import json; d=json.load(open('$OUT/idle.json'))['on']; print(d.get('wakeups_by_source_topic'), d.get('unavailable'))" 2>&1
{ echo "after $(date -u +%T)"; q; } >> $OUT/env.txt 2>&1
diff <(sed -n 2p $OUT/env.txt | cut -d, -f1-6) <(grep -A1 "^after" $OUT/env.txt | tail -1 | cut -d, -f1-6) && echo "GPU settings unchanged"
ps -eo pid,stat,etime,comm | grep -i "python\|nvml\|etcd\|testapiserver" | grep -v grep | head
