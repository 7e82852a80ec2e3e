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

# Every scheme name experiment.schemes may hold (and experiment.overrides has a field for).
SCHEME_NAMES = ("none", "sinusoidal", "sinusoidal_unscaled", "learned", "rope", "alibi",
                "t5_bias")


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
      # sinusoidal_unscaled is the ablation: the sinusoid added at unit amplitude to token
      # embeddings of std 0.02 (the earlier "sinusoidal" row).
      schemes="none,sinusoidal,sinusoidal_unscaled,learned,rope,alibi,t5_bias",
      # Every scheme trains once per seed (runs/<scheme>/seed<k>); tables give mean +- sd
      # over seeds and a bootstrap interval over evaluation windows.
      seeds="0,1,2" if not args.tiny else "0",
      # Per scheme, settings of its training config: "key=value;key=value" (dotted keys of
      # the config: opt.lr, opt.warmup_steps, train.steps, model.*). Vaswani et al. multiply
      # the token embeddings by sqrt(d_model) before adding the sinusoid: at d_model 128 and
      # init std 0.02 a token's embedding has norm 0.23 (2.56 scaled) against the sinusoid's
      # 8.0 at every position.
      overrides=ml_collections.ConfigDict(
          {name: "" for name in SCHEME_NAMES} | {"sinusoidal": "model.scale_embeddings=True"}),
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
