#!/usr/bin/env bash
# scaling_deep.sh PARALLEL: issue 18's extended_deep grid (configs/scaling.py:design=extended_deep)
# from the frozen 624876f. Its 46 runs whose overrides equal the extended grid's are copied from
# that grid's workdir (checked against each run's config.json); the 14 with new shapes train.
# Resumable: rerun it; finished runs are skipped, interrupted ones resume from their checkpoint.
set -u
F=/work/frozen-624876f
E=/work/runs/scaling/grammar_corpus/extended
W=/work/runs/scaling/grammar_corpus/extended_deep
cd "$F"
export PYTHONPATH="$F"
echo "$(date -u) scaling_deep start (parallel $1)"
/work/main/.venv/bin/python /work/main/experiments/records/scripts/copy_unchanged_runs.py \
  extended extended_deep "$E" "$W"
nice -n 19 /work/main/.venv/bin/python -m launch.local --config configs/scaling.py:design=extended_deep \
  --workdir "$W" --parallel "$1"
echo "$(date -u) scaling_deep grid rc=$?"
(cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records)
echo "$(date -u) scaling_deep records saved"
