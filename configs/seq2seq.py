r"""Encoder-decoder (2017 Transformer / T5 layout) on a built-in algorithmic task.

    python -m transformer.train --config configs/seq2seq.py:size=s,task=reverse \
        --workdir runs/s2s_reverse
    python -m transformer.train --config configs/seq2seq.py:size=s,dataset=kv_retrieval \
        --workdir runs/s2s_kv

The decoder is trained with teacher forcing on the target sequence. Arguments: size,
dataset (an inputs/targets dataset: algorithmic or kv_retrieval), task (algorithmic: copy |
reverse | sort | addition). Any key can be overridden with --config.KEY. seq_len holds the
longest example of every split with EOS (64 for copy/reverse/sort, 72 for addition, 168 for
kv_retrieval at data.num_pairs=16); a --config override of the lengths or pairs that no
longer fits is an error before training that says how long data.seq_len must be.
"""

from transformer import schema
from transformer import data
from transformer.data import builders


def get_config(arg: str | None = None):
  args = schema.parse_args(arg, size="s", dataset="algorithmic", task="reverse")
  model = schema.model_config(kind="encoder_decoder", max_len=256,
                              **schema.size_config(args.size))
  data_config = data.default_config()
  data_config.name = args.dataset
  data_config.task = args.task
  # Examples are never truncated (a cut answer is unlearnable), so rows hold the longest
  # example of any split (test_long too) with EOS, in multiples of 8: 64 bytes for copy,
  # reverse and sort, 72 for addition (66 at 32 digits), 168 for kv_retrieval at 16 pairs.
  longest = max(builders.longest_seq2seq_chars(data_config, split) or 0
                for split in ("train", "test_long"))
  data_config.seq_len = max(64, -(-(longest + 1) // 8) * 8)
  config = schema.experiment_config(model, data_config, schema.objective_config("seq2seq"),
                                    steps=600, batch_size=32, log_every=25, eval_every=200,
                                    checkpoint_every=200)
  config.opt.warmup_steps = 50
  return config
