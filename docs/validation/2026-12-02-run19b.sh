#!/bin/bash
# GPU call 2 for issue 41: idle cost after the /dev mask fix (by source/topic), the remaining latency classes, soak beside the real plugin
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 GPUWARDEN_DEVICE_PLUGIN=$PWD/.plugin
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv,noheader; }
q > $OUT/env-before.txt 2>&1; uname -r >> $OUT/env-before.txt
echo "== idle $(date -u +%T)"
timeout 170 python3 bench/wake_idle.py --root / --minutes 1.0 --out $OUT/idle.json > $OUT/idle.log 2>&1; echo "idle rc=$?"
cat $OUT/idle.log; python3 -c "import json;d=json.load(open('$OUT/idle.json'));print(d['on'].get('wakeups_by_source_topic'))"
echo "== latency $(date -u +%T)"
timeout 200 python3 bench/event_latency.py --live --runs 10 --classes plugin-socket-gone --out $OUT/latency.json > $OUT/latency.log 2>&1; echo "latency rc=$?"
tail -6 $OUT/latency.log
echo "== soak $(date -u +%T)"
timeout 170 python3 bench/agent_soak_plugin.py --idle 5 --idle-after 5 --out $OUT/soak.json --checks 1000 --interval 0.05 > $OUT/soak.log 2>&1; echo "soak rc=$?"
tail -12 $OUT/soak.log
q > $OUT/env-after.txt 2>&1; diff <(cut -d, -f1-6 $OUT/env-before.txt | head -1) <(cut -d, -f1-6 $OUT/env-after.txt) && echo "GPU settings unchanged"; cat $OUT/env-after.txt
ps -eo pid,comm | grep -i "nvidia-device\|python" | grep -v grep | head
