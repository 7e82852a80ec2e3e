#!/usr/bin/env bash
# gather19.sh: issue 19's probes gather with main's code, evaluation only (every run it names is
# finished: T5 bias with its curriculum and 3000-step cap, none with its curriculum, RoPE at its
# first retry, the LM-pretrained runs at their lr retry; learned and sinusoidal at the config's default, the curriculum).
set -u
cd /work/main
echo "$(date -u) gather19 start at $(git rev-parse --short HEAD)"
.venv/bin/python -m experiments.probes.run --config configs/probes.py \
  --workdir /work/runs/probes/grammar_corpus \
  --config.experiment.lm_workdir=/work/runs/extrapolation/grammar_corpus \
  --config.experiment.kv_schemes=none,sinusoidal,learned,rope,alibi,t5_bias \
  --config.experiment.kv_seeds=0,1,2 \
  "--config.experiment.kv_retry.rope=opt.lr=3e-4;opt.warmup_steps=500;kv_max_steps=3000" \
  "--config.experiment.kv_retry.t5_bias=opt.lr=3e-4;opt.warmup_steps=500 | kv_warm_pairs=2,4,8,16;kv_max_steps=3000" \
  "--config.experiment.kv_retry.sinusoidal_unscaled=opt.lr=3e-4;opt.warmup_steps=500" \
  "--config.experiment.kv_pretrained_retry.alibi=opt.lr=3e-4;opt.warmup_steps=500" \
  "--config.experiment.kv_pretrained_retry.none=opt.lr=3e-4;opt.warmup_steps=500" \
  "--config.experiment.kv_pretrained_retry.rope=opt.lr=3e-4;opt.warmup_steps=500;kv_max_steps=3000"
echo "$(date -u) gather19 rc=$?"
