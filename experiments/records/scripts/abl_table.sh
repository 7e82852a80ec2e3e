#!/usr/bin/env bash
# abl_table.sh (a one-off, 2026-12-05): once the extended ablation's launcher has ended, stop the
# frozen f9b4ebf table that scaling_ablation_ext.sh starts (200 resamples, its old columns) and
# make the table with main's code instead: 1000 bootstrap resamples (250 for approach 3), the
# budgets column, the shared-budget refit, the lowest losses and ablation.png; at nice 0, so it
# takes a core ahead of the nice-19 jobs that start beside it. Writes into the ablation's dir.
set -u
A=/work/runs/scaling/grammar_corpus/ablation_extended
W=/work/runs/scaling/grammar_corpus/extended
while pgrep -f "launch.local --config configs/scaling.py:design=ablation_extended" > /dev/null; do
  sleep 30
done
for _ in $(seq 60); do  # the frozen script saves the records first, then starts its table
  pkill -f "experiments.scaling.ablation --out $A" && break
  sleep 5
done
cd /work/main
echo "$(date -u) abl_table start at $(git rev-parse --short HEAD)"
start=$(date +%s)
.venv/bin/python -m experiments.scaling.ablation --bootstrap 1000 --out "$A" "$A" "$W"
echo "$(date -u) abl_table rc=$? in $(( $(date +%s) - start )) s"
