#!/usr/bin/env bash
# scaling_deep_window.sh PARALLEL: issue 18's extended_deep_window grid (configs/scaling.py) from
# the frozen 0960d60 (its first 63 runs), then ca5e0c8 (the 4 seeds at the measured minima). Its 60 runs that equal the deep grid's are copied from that grid's
# workdir (checked against each run's config.json); the 3 sizes new to the window train.
# Waits for the deep ablation to finish first (it holds both cores).
# Resumable: rerun it; finished runs are skipped, interrupted ones resume from their checkpoint.
set -u
F=/work/frozen-ca5e0c8
D=/work/runs/scaling/grammar_corpus/extended_deep
W=/work/runs/scaling/grammar_corpus/extended_deep_window
until grep -q "scaling_deep_ablation grid rc" /work/runs/scaling_deep_ablation.log; do sleep 30; done
cd "$F"
export PYTHONPATH="$F"
echo "$(date -u) scaling_deep_window start (parallel $1)"
/work/main/.venv/bin/python /work/main/experiments/records/scripts/copy_unchanged_runs.py \
  extended_deep extended_deep_window "$D" "$W"
nice -n 19 /work/main/.venv/bin/python -m launch.local \
  --config configs/scaling.py:design=extended_deep_window --workdir "$W" --parallel "$1"
echo "$(date -u) scaling_deep_window grid rc=$?"
(cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records)
echo "$(date -u) scaling_deep_window records saved"
