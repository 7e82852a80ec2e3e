#!/usr/bin/env bash
# Every committed experiment result, in order of priority; re-running resumes where it
# stopped (finished runs are skipped, interrupted ones resume from their checkpoints).
#   nohup experiments/run_all.sh > run_all.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
R=experiments
for dataset in grammar_corpus python_stdlib; do
  $PY -m experiments.extrapolation.run --config "configs/extrapolation.py:dataset=$dataset" \
      --workdir "$R/extrapolation/results/$dataset"
  $PY -m launch.local --config "configs/scaling.py:dataset=$dataset" \
      --workdir "$R/scaling/results/$dataset" --parallel 2
  $PY -m experiments.scaling.fit --workdir "$R/scaling/results/$dataset" --min_layers 2
  if [ "$dataset" = grammar_corpus ]; then
    $PY -m experiments.probes.run --config configs/probes.py \
        --workdir "$R/probes/results/$dataset" \
        --config.experiment.lm_workdir="$R/extrapolation/results/$dataset"
  fi
done
