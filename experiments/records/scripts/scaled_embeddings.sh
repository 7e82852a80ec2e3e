#!/usr/bin/env bash
# scaled_embeddings.sh WAIT_PID CPUS: wait for WAIT_PID, then learned's and none's from-scratch
# retrieval under the every-seed protocol (frozen d853608) with a fourth attempt: token
# embeddings scaled by sqrt(d_model) (model.scale_embeddings=True, as the sinusoidal row runs)
# and the 2,4,8,16 curriculum. Their first three attempts are finished and cached on seed 0;
# seeds 1-2 train only if seed 0 meets the criterion. Then save the records under the lock.
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/frozen-d853608
export PYTHONPATH=/work/frozen-d853608
R="opt.lr=3e-4;opt.warmup_steps=500 | kv_warm_pairs=2,4,8,16 | model.scale_embeddings=True;kv_warm_pairs=2,4,8,16"
echo "$(date -u) scaled_embeddings start (cpus $2)"
taskset -c "$2" /work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes/grammar_corpus \
  --config.experiment.lm_workdir=/work/runs/extrapolation/grammar_corpus \
  --config.experiment.kv_schemes=learned,none --config.experiment.kv_pretrained_schemes= \
  --config.experiment.kv_seeds=0,1,2 \
  --config.experiment.kv_retry.learned="$R" --config.experiment.kv_retry.none="$R"
echo "$(date -u) scaled_embeddings rc=$?"
cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records
