#!/bin/bash
# GPU call 1 for issue 41: latency per fault class (node tree + live kmsg follower), idle cost, soak beside the real plugin
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv; uname -r; nproc; free -g | head -2; }
q > $OUT/env-before.txt 2>&1
python3 -c 'import grpc, msgspec, kubernetes; print(grpc.__version__, msgspec.__version__)' >> $OUT/env-before.txt 2>&1
git log --oneline -1 >> $OUT/env-before.txt 2>&1 || true
echo "== latency $(date -u +%T)"
timeout 230 python3 bench/event_latency.py --live --runs 15 --classes xid79,uvm-removed,plugin-socket-gone --out $OUT/latency.json > $OUT/latency.log 2>&1; echo "latency rc=$?"
tail -25 $OUT/latency.log
echo "== idle $(date -u +%T)"
timeout 170 python3 bench/wake_idle.py --root / --minutes 1.2 --out $OUT/idle.json > $OUT/idle.log 2>&1; echo "idle rc=$?"
tail -15 $OUT/idle.log
echo "== soak $(date -u +%T)"
timeout 150 python3 bench/agent_soak_plugin.py --idle 10 --idle-after 10 --out $OUT/soak.json --checks 1000 --interval 0.05 > $OUT/soak.log 2>&1; echo "soak rc=$?"
tail -15 $OUT/soak.log
q > $OUT/env-after.txt 2>&1; diff <(grep -v memory $OUT/env-before.txt | head -1) <(head -1 $OUT/env-after.txt) && echo "GPU settings unchanged"
cat $OUT/env-after.txt
ps -eo pid,comm | grep -i "nvidia-device\|gpuwarden\|python" | grep -v grep | head
