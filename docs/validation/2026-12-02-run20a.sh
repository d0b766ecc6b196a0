#!/bin/bash
# GPU call 20a (issue 43): the two arrival-blind scenarios as written last session, first run; plus the crowded-node negatives
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 GPUWARDEN_DEVICE_PLUGIN=$PWD/.plugin
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv; uname -r; nproc; free -g | head -2; }
q > $OUT/env-before.txt 2>&1; cat $OUT/env-before.txt
git log --oneline -1 2>/dev/null || true
echo "== scenarios $(date -u +%T)"
timeout 480 python3 tests/gpu/validate.py --out $OUT/v --only memory-late-leaker-separated memory-unsure-last-resort memory-two-graphics memory-heavy-legit > $OUT/validate.log 2>&1; echo "validate rc=$?"
tail -60 $OUT/validate.log
ls $OUT/v 2>/dev/null | head; (cd $OUT && tar czf v.tgz v 2>/dev/null && rm -rf v)
q > $OUT/env-after.txt 2>&1; diff <(head -2 $OUT/env-before.txt | cut -d, -f1-6) <(head -2 $OUT/env-after.txt | cut -d, -f1-6) && echo "GPU settings unchanged"
cat $OUT/env-after.txt
ps -eo pid,stat,comm | grep -i "gpuwarden\|python\|gl_worker" | grep -v grep | head
