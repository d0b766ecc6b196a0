#!/bin/bash
# GPU call 25 (issue 43): the two late-leaker scenarios once more after run 24 (a candidate that gave memory back when it left counts as departed). the late leaker with and without the API server after run 22's fixes (2 s tracking windows; a child moved into a pod's cgroup is that pod's), and the two negatives again (two graphics pods from the start, legitimate graphics load with stop-graphics-candidates).
# Carry: .mem (whl/, kit/ with testapiserver.xz + etcd.xz + SHA256SUMS, gl/, authz.json). Output: a log and one tgz.
set -u
C=.mem
for f in $C/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $C/whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1 GW_MEM_APISERVER_KIT=$PWD/$C/kit GW_MEM_AUTHZ_FILE=$PWD/$C/authz.json
mkdir -p /tmp/api $OUT/r
for b in testapiserver etcd; do
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' $C/kit/$b.xz /tmp/api/$b && chmod 755 /tmp/api/$b
done
export GPUWARDEN_TESTAPISERVER=/tmp/api/testapiserver PATH=/tmp/api:$PATH
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv,noheader; }
{ echo "before $(date -u +%T)"; q; uname -r; nproc; python3 -V; command -v gcc; grep MemAvailable /proc/meminfo; } > $OUT/r/env.txt 2>&1
cat $OUT/r/env.txt
echo "== memory $(date -u +%T)"
timeout 400 python3 tests/gpu/validate.py --out $OUT/r --only memory-late-leaker-separated memory-late-leaker-separated-api \
  > $OUT/r/validate.log 2>&1; echo "memory rc=$?"
grep -E '^\[(PASS|FAIL)\]|separated|fast leak|passed' $OUT/r/validate.log | cut -c1-700
python3 - $OUT/r/validation.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    for x in (r.get("agent") or {}).get("log", []):
        if x.get("msg") in ("memory-separation", "remediation", "memory-unsure"):
            print(r["scenario"], json.dumps(x)[:900])
PY
{ echo "after $(date -u +%T)"; q; } >> $OUT/r/env.txt 2>&1
diff <(sed -n 2p $OUT/r/env.txt | cut -d, -f1-6) <(grep -A1 "^after" $OUT/r/env.txt | tail -1 | cut -d, -f1-6) && echo "GPU settings unchanged"
ps -eo pid,stat,etime,comm | grep -i "python\|nvml\|etcd\|testapiserver\|gl_worker" | grep -v grep | head
rm -f $OUT/r/*.tar.gz; (cd $OUT && tar czf run25.tgz r && rm -rf r)
