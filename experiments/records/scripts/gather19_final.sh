#!/usr/bin/env bash
# gather19_final.sh WAIT_PID: wait for WAIT_PID, then issue 19's final probes gather with main's
# code, evaluation only. Every retry entry names what its runs trained with: learned and none
# with their fourth attempt (scaled embeddings + curriculum, capped at 3000 steps since cap3000.sh), RoPE with its curriculum (both
# entries capped at 3000 steps), T5 bias with its 3000-step curriculum, the LM-pretrained runs at
# their lr retry. The tables land in /work/runs/probes/grammar_corpus (published by hand: the
# results.md header comment and the "before issue 19's fixes" section are kept by hand).
set -u
while kill -0 "$1" 2>/dev/null; do sleep 60; done
cd /work/main
echo "$(date -u) gather19_final start at $(git rev-parse --short HEAD)"
S="opt.lr=3e-4;opt.warmup_steps=500 | kv_warm_pairs=2,4,8,16 | model.scale_embeddings=True;kv_warm_pairs=2,4,8,16;kv_max_steps=3000"
.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes/grammar_corpus \
  --config.experiment.lm_workdir=/work/runs/extrapolation/grammar_corpus \
  --config.experiment.kv_schemes=none,sinusoidal,learned,rope,alibi,t5_bias \
  --config.experiment.kv_seeds=0,1,2 \
  "--config.experiment.kv_retry.learned=$S" "--config.experiment.kv_retry.none=$S" \
  "--config.experiment.kv_retry.rope=opt.lr=3e-4;opt.warmup_steps=500;kv_max_steps=3000 | kv_warm_pairs=2,4,8,16;kv_max_steps=3000" \
  "--config.experiment.kv_retry.t5_bias=opt.lr=3e-4;opt.warmup_steps=500 | kv_warm_pairs=2,4,8,16;kv_max_steps=3000" \
  "--config.experiment.kv_retry.sinusoidal_unscaled=opt.lr=3e-4;opt.warmup_steps=500" \
  "--config.experiment.kv_pretrained_retry.alibi=opt.lr=3e-4;opt.warmup_steps=500" \
  "--config.experiment.kv_pretrained_retry.none=opt.lr=3e-4;opt.warmup_steps=500" \
  "--config.experiment.kv_pretrained_retry.rope=opt.lr=3e-4;opt.warmup_steps=500;kv_max_steps=3000"
echo "$(date -u) gather19_final rc=$?"
