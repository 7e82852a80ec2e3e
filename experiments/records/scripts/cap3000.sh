#!/usr/bin/env bash
# cap3000.sh WAIT_PID CPUS: wait for WAIT_PID, then learned's and none's fourth retrieval attempt
# (scaled embeddings + the 2-4-8-16 curriculum) continued from its step-2000 cap to 3000 steps,
# the cap RoPE's and T5 bias's attempts had ("kv_max_steps=3000" on the entry: the same run
# directory resumes from its step-2000 checkpoint; checks at 2500 and 3000). If seed 0 meets the
# criterion, seeds 1-2 train with the same entry (the every-seed protocol). Frozen d853608, as
# scaled_embeddings.sh. Then save the records under the lock.
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/frozen-d853608
export PYTHONPATH=/work/frozen-d853608
R="opt.lr=3e-4;opt.warmup_steps=500 | kv_warm_pairs=2,4,8,16 | model.scale_embeddings=True;kv_warm_pairs=2,4,8,16;kv_max_steps=3000"
echo "$(date -u) cap3000 start (cpus $2)"
taskset -c "$2" /work/main/.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes/grammar_corpus \
  --config.experiment.lm_workdir=/work/runs/extrapolation/grammar_corpus \
  --config.experiment.kv_schemes=learned,none --config.experiment.kv_pretrained_schemes= \
  --config.experiment.kv_seeds=0,1,2 \
  --config.experiment.kv_retry.learned="$R" --config.experiment.kv_retry.none="$R"
echo "$(date -u) cap3000 rc=$?"
cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records
