r"""Probes of trained decoders (agreement with attractors, lost in the middle, attention maps).

    python -m experiments.probes.run --config configs/probes.py \
        --workdir experiments/probes/results/grammar_corpus \
        --config.experiment.lm_workdir=experiments/extrapolation/results/grammar_corpus

The language models are the extrapolation experiment's (same config; reused when
experiment.lm_workdir points at a finished or partial extrapolation workdir, trained here
otherwise). The retrieval models are decoders trained on kv_retrieval with kv_train_pairs
pairs per item and evaluated with fewer, as many and twice as many pairs.
Arguments: those of configs/extrapolation.py.
"""

from configs import extrapolation


def get_config(arg: str | None = None):
  config = extrapolation.get_config(arg)
  tiny = config.data.size == "tiny"
  config.experiment.update(dict(
      lm_workdir="",
      seed=0,
      agreement_items=200 if not tiny else 8,
      # Trained on 4 pairs per item (several items packed per row, so every row carries
      # several supervised answers): with 16 pairs and lr 3e-3 the size-s decoder stayed at
      # chance on the answer digits after 1150 steps, with 4 pairs and lr 1e-3 it left chance
      # within 200 steps. 8 and 16 pairs are 2x and 4x the training context.
      kv_train_pairs=4,
      kv_eval_pairs="2,4,8,16" if not tiny else "2,4,8",
      kv_lr=1e-3,
      kv_seq_len=192 if not tiny else 64,
      kv_max_len=384 if not tiny else 128,
      # Retrieval models cost most of the budget: two schemes, the relative ones most
      # likely to extrapolate (the CI variant covers every scheme).
      kv_schemes="rope,alibi" if not tiny else "rope,learned",
      kv_steps=1500 if not tiny else config.train.steps,
      kv_positions=8 if not tiny else 3,
      kv_items=100 if not tiny else 4,
      map_scheme="rope",
      # Every word is the grammar's (tests/attention_maps_test.py checks it): a subject with
      # two attractors of the other number, then its verb.
      map_sentence="The keys to the cabinet beside the door are missing.",
      map_layer=-1,
      census_items=100 if not tiny else 2,
  ))
  return config
