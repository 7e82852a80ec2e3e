#!/usr/bin/env bash
# t5_cap.sh WAIT_PID SEEDS: wait for WAIT_PID, then T5 bias's from-scratch retrieval seeds SEEDS
# (first listed = 0, which searches the settings; its attempts are cached) with the curriculum
# retry capped at 3000 steps, from the frozen d51b776; then save the records under the lock.
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/frozen-d51b776
echo "$(date -u) t5_cap seeds $2 start"
/work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes/grammar_corpus \
  --config.experiment.lm_workdir=/work/runs/extrapolation/grammar_corpus \
  --config.experiment.kv_schemes=t5_bias --config.experiment.kv_pretrained_schemes= \
  --config.experiment.kv_seeds="$2" \
  --config.experiment.kv_retry.t5_bias="opt.lr=3e-4;opt.warmup_steps=500 | kv_warm_pairs=2,4,8,16;kv_max_steps=3000"
echo "$(date -u) t5_cap seeds $2 rc=$?"
cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records
