r"""Encoder with a masked-LM head (BERT-style) on the built-in grammar corpus.

    python -m transformer.train --config configs/mlm.py:size=s --workdir runs/mlm_s

The data layer selects 15% of real tokens per document and replaces 80% of those with
[MASK], 10% with a random token and keeps 10%; the loss counts only the selected tokens.
Arguments: size, dataset (as in configs/lm.py). Any key can be overridden with --config.KEY.
"""

from transformer import schema
from transformer import data


def get_config(arg: str | None = None):
  args = schema.parse_args(arg, size="s", dataset="grammar_corpus")
  model = schema.model_config(kind="encoder", max_len=256, **schema.size_config(args.size))
  data_config = data.default_config()
  data_config.name = args.dataset
  data_config.seq_len = 128
  config = schema.experiment_config(model, data_config, schema.objective_config("mlm"),
                                    steps=600, batch_size=16, log_every=25, eval_every=200,
                                    checkpoint_every=200)
  config.opt.warmup_steps = 50
  return config
