#!/bin/bash
# issue 41, branch flood, GPU call B (~6 min): the idle check beside the real device plugin, before (base/src: the
# tree of commit 85b56a7, carried as an untracked directory `base/`) and after, interleaved, 400 checks each
# (as run 19b's soak, fewer checks). Without base/ only the "after" runs are made.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 GPUWARDEN_DEVICE_PLUGIN=$PWD/.plugin
soak() {  # $1: label, $2: source tree
  GPUWARDEN_SRC=$2 timeout 85 python3 bench/agent_soak_plugin.py --idle 3 --idle-after 3 --checks 400 --interval 0.05 \
    --out $OUT/soak-$1.json > $OUT/soak-$1.log 2>&1; echo "soak $1 rc=$?"
  grep -E "CPU per check|RSS: steady|RssAnon" $OUT/soak-$1.log | cut -c1-220
}
for i in 1 2; do
  [ -d base/src ] && soak before$i $PWD/base/src
  soak after$i $PWD/src
done
