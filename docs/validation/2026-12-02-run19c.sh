#!/bin/bash
# GPU call 3 for issue 41: NVML reports the GPU lost (the inject shim over the host's NVML), and idle with every source wired (nvml included)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv,noheader; }
q > $OUT/env-before.txt 2>&1; uname -r >> $OUT/env-before.txt
echo "== nvml-lost $(date -u +%T)"
timeout 150 python3 bench/event_latency.py --runs 10 --classes nvml-lost --out $OUT/latency.json > $OUT/latency.log 2>&1; echo "latency rc=$?"
tail -4 $OUT/latency.log; python3 -c "import json;d=json.load(open('$OUT/latency.json'));print(d['classes']['nvml-lost'].get('what'))"
echo "== idle $(date -u +%T)"
timeout 150 python3 bench/wake_idle.py --root / --minutes 1.0 --out $OUT/idle.json > $OUT/idle.log 2>&1; echo "idle rc=$?"
cat $OUT/idle.log; python3 -c "import json;d=json.load(open('$OUT/idle.json'));print(d['on'].get('wakeups_by_source_topic'), d['on'].get('unavailable'))"
q > $OUT/env-after.txt 2>&1; diff <(cut -d, -f1-6 $OUT/env-before.txt | head -1) <(cut -d, -f1-6 $OUT/env-after.txt) && echo "GPU settings unchanged"; cat $OUT/env-after.txt
ps -eo pid,stat,comm | grep -i "python\|nvml" | grep -v grep | head
