#!/usr/bin/env bash
# scaling_ablation_ext.sh WAIT_PID PARALLEL CPUS: wait for WAIT_PID, then issue 18's ablation of
# the extended grid (configs/scaling.py:design=ablation_extended: its 30 models and budgets, one
# seed, the original settings) from the frozen f9b4ebf on CPUS, the records, and the ablation table
# against the extended grid (experiments.scaling.ablation).
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/frozen-f9b4ebf
export PYTHONPATH=/work/frozen-f9b4ebf
A=/work/runs/scaling/grammar_corpus/ablation_extended
W=/work/runs/scaling/grammar_corpus/extended
echo "$(date -u) scaling_ablation_ext start (parallel $2, cpus $3)"
taskset -c "$3" /work/main/.venv/bin/python -m launch.local \
  --config configs/scaling.py:design=ablation_extended --workdir "$A" --parallel "$2"
echo "$(date -u) scaling_ablation_ext grid rc=$?"
(cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records)
/work/main/.venv/bin/python -m experiments.scaling.ablation --out "$A" "$A" "$W"
echo "$(date -u) scaling_ablation_ext ablation rc=$?"
