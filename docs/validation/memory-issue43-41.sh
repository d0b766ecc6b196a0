#!/bin/bash
# One GPU call for issue 43's done-when and issue 41's incident-4 target: every memory scenario of the two issues
# (tests/gpu/memory_scenarios.ISSUE_43_41), about 6 minutes on one H200. Run from the repository root with the
# folder .mem carried (docs/validation.md "When arrival cannot tell (issue 43)": how to make it):
#   .mem/gl/*.deb    the libglvnd loaders (EGL), unpacked into / as the device README says
#   .mem/whl/*.whl   gpuwarden's dependencies, moderngl + glcontext, the Kubernetes client and its own
#   .mem/kit/        testapiserver.xz and etcd.xz (the test API server; xz: the 64 MiB carry limit)
#   .mem/authz.json  the chart's RBAC and admission policies, rendered where the Helm SDK is
# Nothing here changes a GPU setting or writes to the kernel log; every process, cgroup and file the scenarios
# make is removed by them; the leaks are bounded (a quarter of MemAvailable at most, 32 GiB).
set -u
C=.mem
for f in $C/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $C/whl/*.whl || exit 9
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 GW_MEM_APISERVER_KIT=$PWD/$C/kit GW_MEM_AUTHZ_FILE=$PWD/$C/authz.json
q() { nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv,noheader; }
{ q; uname -r; nproc; grep -E 'MemTotal|MemAvailable' /proc/meminfo; cat /proc/uptime; git log --oneline -1 2>/dev/null; } > $OUT/env-before.txt 2>&1
python3 -c 'import moderngl, kubernetes, msgspec, grpc; print("moderngl", moderngl.__version__, "kubernetes", kubernetes.__version__, "msgspec", msgspec.__version__, "grpc", grpc.__version__)' >> $OUT/env-before.txt 2>&1
cat $OUT/env-before.txt
set -o pipefail
timeout 550 python3 tests/gpu/validate.py --out $OUT --only memory-late-leaker-separated memory-late-leaker-separated-api \
  memory-graphics-legit-unsure memory-unsure-last-resort memory-fast-leak-defaults memory-fast-leak-defaults-api \
  2>&1 | tee $OUT/validate.log
echo "validate rc=$?"
{ q; grep -E 'MemAvailable' /proc/meminfo; } > $OUT/env-after.txt 2>&1
diff <(head -1 $OUT/env-before.txt | cut -d, -f1-6) <(head -1 $OUT/env-after.txt | cut -d, -f1-6) && echo "GPU settings unchanged"
cat $OUT/env-after.txt
echo "left behind:"; ps -eo pid,comm,args | grep -E "gl_worker|gpu_fill|gpuwarden|etcd|testapiserver" | grep -v grep | head
ls /sys/fs/cgroup/kubepods.slice 2>/dev/null | head -3; ls /var/lib/kubelet /run/gpuwarden 2>/dev/null | head -3
