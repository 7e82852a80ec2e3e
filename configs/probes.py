r"""Probes of trained decoders (agreement with attractors, lost in the middle, attention maps).

    python -m experiments.probes.run --config configs/probes.py \
        --workdir experiments/probes/results/grammar_corpus \
        --config.experiment.lm_workdir=experiments/extrapolation/results/grammar_corpus

The language models are the extrapolation experiment's (same config and seeds; reused when
experiment.lm_workdir points at a finished or partial extrapolation workdir, trained here
otherwise). The retrieval models are decoders trained on kv_retrieval items of kv_min_pairs
to kv_train_pairs pairs and evaluated within and beyond that (experiments/probes/README.md).
Arguments: those of configs/extrapolation.py.
"""

import ml_collections

from configs import extrapolation


def get_config(arg: str | None = None):
  config = extrapolation.get_config(arg)
  tiny = config.data.size == "tiny"
  config.experiment.update(dict(
      lm_workdir="",
      seed=0,
      # Items per number of attractors (0..4), per seed: >= 500 so a Wilson interval at 0.95
      # is about +-0.02.
      agreement_items=500 if not tiny else 8,
      # Retrieval (lost in the middle, Liu et al. 2023): every item has between kv_min_pairs
      # and kv_train_pairs pairs (uniform), so the model sees the query at every position of
      # every context size up to the training one (32 pairs: ~330 byte tokens). Evaluated at
      # 8, 16, 32 pairs (within) and 48, 64 (beyond the training context), kv_items items at
      # each of kv_positions evenly spaced queried positions.
      kv_train_pairs=32 if not tiny else 4,
      kv_min_pairs=2,
      kv_eval_pairs="8,16,32,48,64" if not tiny else "2,4,8",
      kv_lr=1e-3,
      kv_warmup_steps=200 if not tiny else 1,
      # Rows of 512 tokens hold one to several items (the longest is ~340 tokens); models
      # position up to kv_max_len so 64-pair items (~660 tokens) fit all but `learned`.
      kv_seq_len=512 if not tiny else 64,
      kv_max_len=1024 if not tiny else 128,
      kv_schemes=("none,sinusoidal,learned,rope,alibi,t5_bias" if not tiny
                  else "rope,learned"),
      # One seed per retrieval model (the budget); the positions' intervals are binomial.
      kv_seeds="0",
      kv_steps=1500 if not tiny else config.train.steps,
      # Per scheme, "key=value;..." over the retrieval config (opt.lr, opt.warmup_steps,
      # train.steps): the knobs to bring a scheme that stays below the criterion to it
      # (RoPE stayed at 0.21 at its training length in the earlier run).
      kv_overrides=ml_collections.ConfigDict({name: "" for name in extrapolation.SCHEME_NAMES}
                                             | {"sinusoidal": "model.scale_embeddings=True"}),
      # The stated criterion: mean exact-match accuracy over positions at kv_train_pairs.
      # Schemes below it are training failures, reported but not compared.
      kv_criterion=0.9,
      kv_positions=8 if not tiny else 3,
      kv_items=500 if not tiny else 4,
      map_scheme="rope",
      # Every word is the grammar's (tests/attention_maps_test.py checks it): a subject with
      # two attractors of the other number, then its verb.
      map_sentence="The keys to the cabinet beside the door are missing.",
      census_items=200 if not tiny else 2,
  ))
  return config
