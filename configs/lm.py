r"""Decoder-only language model on the built-in grammar corpus (bytes), causal LM loss.

    python -m transformer.train --config configs/lm.py:size=s --workdir runs/lm_s

Arguments after the colon: size (xs | s | m | l | xl, see transformer/schema.py), dataset (a
built-in or prepared TFDS name), precision (fp32 | bf16: bfloat16 compute on float32 weights
and optimizer state, for GPU/TPU; schema.PRECISIONS). Anything else from the command line, e.g.
    --config.model.position.name=alibi --config.opt.lr=1e-3 --config.train.steps=5000
The default (size=s, 600 steps of 16 x 128 tokens) is the README's first run: about a minute
on a 2-core CPU (44 s measured on an AMD EPYC Zen 5 VM, corpus generation included, 36 s once it
exists; 60-63 s once it exists on a Zen 4 VM, 2026-12-05), ending at
eval loss ~1.03 nats/token against the corpus' unigram entropy of 2.95; size=xs: 1.23 in 14 s.
"""

from transformer import schema
from transformer import data


def get_config(arg: str | None = None):
  args = schema.parse_args(arg, size="s", dataset="grammar_corpus", precision="fp32")
  model = schema.model_config(kind="decoder", max_len=256, **schema.size_config(args.size),
                              **schema.precision_config(args.precision))
  data_config = data.default_config()
  data_config.name = args.dataset
  data_config.seq_len = 128
  config = schema.experiment_config(model, data_config, schema.objective_config("lm"),
                                    steps=600, batch_size=16, log_every=25, eval_every=200,
                                    checkpoint_every=200)
  config.opt.warmup_steps = 50
  return config
