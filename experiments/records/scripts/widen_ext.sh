#!/usr/bin/env bash
# widen_ext.sh SCALED_PID EXT_SH_PID LAUNCHER_PID: once core 0's current job (SCALED_PID) ends,
# stop the extended grid's one-core launcher (SIGTERM: its run checkpoints) and finish the grid
# and its fit on both cores (scaling_ext.sh with --parallel 2); the rest of core 0's queue waits for this.
set -u
alive() { kill -0 "$1" 2>/dev/null; }
while alive "$1"; do sleep 30; done
if alive "$3"; then
  kill -KILL "$2" 2>/dev/null   # the one-core scaling_ext.sh, so it does not fit a partial grid
  kill -TERM "$3"
  while alive "$3"; do sleep 5; done
  echo "$(date -u) widen_ext: stopped the one-core launcher, widening"
fi
cd /work/runs && ./scaling_ext.sh 999999 2 0,1
