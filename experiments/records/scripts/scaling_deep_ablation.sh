#!/usr/bin/env bash
# scaling_deep_ablation.sh CPUS: issue 18's ablation_extended_deep (configs/scaling.py) from the
# frozen a8aad64 on CPUS. Its 22 runs whose overrides equal ablation_extended's are copied from
# that grid's workdir (checked against each run's config.json); the 8 with new shapes train.
# CPUS "auto": wait until scaling_deep.sh's grid has one run left, then take the other core.
# Resumable: rerun it; finished runs are skipped, interrupted ones resume from their checkpoint.
set -u
F=/work/frozen-a8aad64
E=/work/runs/scaling/grammar_corpus/ablation_extended
W=/work/runs/scaling/grammar_corpus/ablation_extended_deep
L=/work/runs/scaling_deep.log
CPUS=$1
if [ "$CPUS" = auto ]; then
  # The deep grid's last run is its third 1e14 seed of 3.93e5: wait until both others are done.
  until [ "$(grep -c '^done   N=3.93e5,C=1e14' $L)" -ge 2 ] || grep -q "scaling_deep grid rc" $L; do
    sleep 30; done
  busy=$(grep '^start  N=3.93e5,C=1e14,seed=2' $L | sed 's/.*(cpus \(.*\))/\1/')
  CPUS=$([ "$busy" = 0 ] && echo 1 || echo 0)
fi
cd "$F"
export PYTHONPATH="$F"
echo "$(date -u) scaling_deep_ablation start (cpus $CPUS)"
/work/main/.venv/bin/python /work/main/experiments/records/scripts/copy_unchanged_runs.py \
  ablation_extended ablation_extended_deep "$E" "$W"
taskset -c "$CPUS" nice -n 19 /work/main/.venv/bin/python -m launch.local \
  --config configs/scaling.py:design=ablation_extended_deep --workdir "$W" --parallel 1
echo "$(date -u) scaling_deep_ablation grid rc=$?"
(cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records)
echo "$(date -u) scaling_deep_ablation records saved"
