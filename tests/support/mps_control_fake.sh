#!/bin/sh
# A stand-in nvidia-cuda-mps-control for machines without a GPU (CI, dry runs): installed under that
# name in a directory on the MPS control daemon's PATH. `-d` starts a "control daemon" (this script
# again, looping; its comm is its file name, as the real one's is) that writes control.log in
# $CUDA_MPS_LOG_DIRECTORY and a `control` file in $CUDA_MPS_PIPE_DIRECTORY. A command on stdin
# (`quit`, `set_default_...`, `get_default_active_thread_percentage`) is logged; `quit` stops the
# daemon; any command fails (exit 1) when no daemon runs, as the real client does.
# The daemon execs this with only CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY set.
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
logd=${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}
now() { date '+%Y-%m-%d %H:%M:%S.000'; }
case "$1" in
  -d)
    mkdir -p "$pipe" "$logd"
    "$0" --loop </dev/null >/dev/null 2>&1 &
    echo $! > "$pipe/nvidia-cuda-mps-control.pid"
    : > "$pipe/control"
    echo "[$(now) Control $!] Starting control daemon using socket $pipe/control" >> "$logd/control.log"
    exit 0 ;;
  --loop)
    trap 'exit 0' TERM
    while :; do sleep 1; done ;;
esac
pid=$(cat "$pipe/nvidia-cuda-mps-control.pid" 2>/dev/null)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
  echo "Cannot find MPS control daemon process" >&2
  exit 1
fi
cmd=$(cat)
echo "[$(now) Control $pid] Accepting connection..." >> "$logd/control.log"
echo "[$(now) Control $pid] User did send $cmd" >> "$logd/control.log"
case "$cmd" in
  quit) kill "$pid"; rm -f "$pipe/control" "$pipe/nvidia-cuda-mps-control.pid"
        echo "[$(now) Control $pid] Exit" >> "$logd/control.log" ;;
  get_default_active_thread_percentage) echo 25.0 ;;
esac
exit 0
