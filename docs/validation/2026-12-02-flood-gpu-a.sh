#!/bin/bash
# issue 41, branch flood, GPU call A (~3 min): a later Xid 79 inside 100,000 Xid 13 lines a second (node tree of
# `healthy`, chart defaults), with the flood counted in bulk and, as the same run's peer, every line read
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(nproc; uname -r; uptime) > $OUT/env.txt 2>&1
echo "== flood, bulk $(date -u +%T)"
timeout 200 python3 bench/wake_flood.py --during --trials 10 --seconds 4 --out $OUT/flood-during.json > $OUT/flood-during.log 2>&1; echo "rc=$?"
python3 -c "import json;d=json.load(open('$OUT/flood-during.json'));print({k:v for k,v in d.items() if k!='runs'})"
echo "== flood, every line read (peer) $(date -u +%T)"
timeout 200 python3 bench/wake_flood.py --during --trials 3 --seconds 4 --no-bulk --out $OUT/flood-during-nobulk.json > $OUT/flood-during-nobulk.log 2>&1; echo "rc=$?"
python3 -c "import json;d=json.load(open('$OUT/flood-during-nobulk.json'));print({k:v for k,v in d.items() if k!='runs'})"
