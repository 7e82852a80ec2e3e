#!/usr/bin/env bash
# rope_curriculum.sh WAIT_PID CPUS: wait for WAIT_PID, then RoPE's from-scratch retrieval under
# the every-seed protocol (frozen d853608): retry 1 cached, the curriculum on seed 0, then 1-2.
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/frozen-d853608
export PYTHONPATH=/work/frozen-d853608
echo "$(date -u) rope_curriculum start (cpus $2)"
taskset -c "$2" /work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes/grammar_corpus \
  --config.experiment.lm_workdir=/work/runs/extrapolation/grammar_corpus \
  --config.experiment.kv_schemes=rope --config.experiment.kv_pretrained_schemes= \
  --config.experiment.kv_seeds=0,1,2 \
  --config.experiment.kv_retry.rope="opt.lr=3e-4;opt.warmup_steps=500;kv_max_steps=3000 | kv_warm_pairs=2,4,8,16;kv_max_steps=3000"
echo "$(date -u) rope_curriculum rc=$?"
cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records
