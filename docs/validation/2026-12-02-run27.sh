#!/bin/bash
# GPU call 27 (issue 41): the idle check beside the real device plugin (v0.20.0), the tree before this session
# (base/src: commit 85b56a7, carried as an untracked directory) and after, 300 checks each at 0.05 s, as run 19b's
# soak; the figures per check and RSS against the idle target (51.7 ms a check, 34.7 MiB).
# Carry: .whl .plugin (and base/ travels untracked).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 GPUWARDEN_DEVICE_PLUGIN=$PWD/.plugin
nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current --format=csv,noheader
soak() {  # $1: label, $2: source tree
  GPUWARDEN_SRC=$2 timeout 70 python3 bench/agent_soak_plugin.py --idle 3 --idle-after 3 --checks 300 --interval 0.05 \
    --out $OUT/soak-$1.json > $OUT/soak-$1.log 2>&1; echo "soak $1 rc=$?"
  grep -E "CPU per check|RSS|RssAnon|verdict|first check" $OUT/soak-$1.log | cut -c1-220
}
[ -d base/src ] && soak before $PWD/base/src
soak after $PWD/src
nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current --format=csv,noheader
ps -eo pid,comm | grep -i "nvidia-device\|python" | grep -v grep | head
