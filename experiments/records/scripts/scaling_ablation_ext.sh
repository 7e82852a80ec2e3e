#!/usr/bin/env bash
# scaling_ablation_ext.sh EXT_PID CORE0_PID: issue 18's ablation of the extended grid
# (configs/scaling.py:design=ablation_extended: its 30 models and budgets, one seed, the original
# settings) from the frozen f9b4ebf, on whichever core frees first: core 1 when EXT_PID (the
# extended grid and its fit, core 1) ends, core 0 when CORE0_PID (core 0's queue) ends. When the
# other ends too, the launcher is stopped with SIGTERM (its runs checkpoint) and restarted with
# one run on each core; launch.local skips finished runs and resumes the rest. Then the records
# and, once the extended grid is finished, the ablation table (experiments.scaling.ablation).
set -u
alive() { kill -0 "$1" 2>/dev/null; }
while alive "$1" && alive "$2"; do sleep 60; done
cd /work/frozen-f9b4ebf
export PYTHONPATH=/work/frozen-f9b4ebf
A=/work/runs/scaling/grammar_corpus/ablation_extended
W=/work/runs/scaling/grammar_corpus/extended
grid() {  # grid PARALLEL CPUS
  echo "$(date -u) scaling_ablation_ext grid (parallel $1, cpus $2)"
  taskset -c "$2" /work/main/.venv/bin/python -m launch.local \
    --config configs/scaling.py:design=ablation_extended --workdir "$A" --parallel "$1"
}
if alive "$1" || alive "$2"; then
  if alive "$1"; then other=$1; cpu=0; else other=$2; cpu=1; fi
  grid 1 "$cpu" &
  launcher=$!
  while alive "$other" && alive "$launcher"; do sleep 60; done
  if alive "$launcher"; then
    pkill -TERM -P "$launcher"; wait "$launcher"  # the launcher itself (the subshell's child)
    echo "$(date -u) scaling_ablation_ext: both cores free, widening"
    grid 2 0,1
  else
    wait "$launcher"
  fi
else
  grid 2 0,1
fi
echo "$(date -u) scaling_ablation_ext grid rc=$?"
(cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records)
while alive "$1"; do sleep 60; done
/work/main/.venv/bin/python -m experiments.scaling.ablation --out "$A" "$A" "$W"
echo "$(date -u) scaling_ablation_ext ablation rc=$?"
