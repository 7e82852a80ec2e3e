r"""Length extrapolation: one small decoder per positional scheme, trained at data.seq_len = L
on contiguous text, evaluated at L, 2L, 4L, 8L and 16L.

    python -m experiments.extrapolation.run --config configs/extrapolation.py \
        --workdir experiments/extrapolation/results/grammar_corpus
    python -m experiments.extrapolation.run \
        --config configs/extrapolation.py:dataset=python_stdlib \
        --workdir experiments/extrapolation/results/python_stdlib

Arguments: size (transformer/schema.py SIZES), dataset, train_length (L), steps, tiny (a CI-sized
run: seconds). Training rows are windows of the concatenated document stream (one segment,
attention crosses document boundaries), as in Press et al. 2022, so that evaluation windows
longer than a document mean the same thing they meant in training.
"""

import ml_collections

from transformer import schema
from transformer import data


def get_config(arg: str | None = None):
  args = schema.parse_args(arg, size="s", dataset="grammar_corpus", train_length=128,
                           steps=1000, tiny=False)
  model = schema.model_config(kind="decoder", attention="auto",
                              **schema.size_config("xs" if args.tiny else args.size))
  data_config = data.default_config()
  data_config.name = args.dataset
  data_config.seq_len = args.train_length
  data_config.cross_document = True
  config = schema.experiment_config(
      model, data_config, schema.objective_config("lm"), steps=args.steps, batch_size=32,
      log_every=50, eval_every=500, checkpoint_every=250)
  config.opt.warmup_steps = min(100, args.steps // 10)
  config.experiment = ml_collections.ConfigDict(dict(
      schemes="none,sinusoidal,learned,rope,alibi,t5_bias",
      eval_multipliers="1,2,4,8,16",
      eval_split="validation",
      eval_tokens=16 * 1024 * 8 if not args.tiny else 512,
      eval_batch_size=8,
      sliding_stride_fraction=0.5,
  ))
  if args.tiny:
    data_config.size = "tiny"
    data_config.seq_len = 32
    model.num_layers = 1
    config.train.batch_size = 4
    config.train.eval_every = config.train.checkpoint_every = args.steps
    config.train.eval_batches = 1
    config.experiment.eval_multipliers = "1,2"
  return config
