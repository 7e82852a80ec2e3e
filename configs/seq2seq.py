r"""Encoder-decoder (2017 Transformer / T5 layout) on a built-in algorithmic task.

    python -m transformer.train --config configs/seq2seq.py:size=s,task=reverse \
        --workdir runs/s2s_reverse
    python -m transformer.train --config configs/seq2seq.py:size=s,dataset=kv_retrieval \
        --workdir runs/s2s_kv

The decoder is trained with teacher forcing on the target sequence. Arguments: size,
dataset (an inputs/targets dataset: algorithmic or kv_retrieval), task (algorithmic: copy |
reverse | sort | addition). Any key can be overridden with --config.KEY. seq_len is 64 for
algorithmic and 192 for kv_retrieval, whose items (data.num_pairs=16) are 167 tokens with EOS;
more pairs need a longer data.seq_len (the error says how long).
"""

from configs import common
from transformer import data


def get_config(arg: str | None = None):
  args = common.parse_args(arg, size="s", dataset="algorithmic", task="reverse")
  model = common.model_config(kind="encoder_decoder", max_len=256,
                              **common.size_config(args.size))
  data_config = data.default_config()
  data_config.name = args.dataset
  data_config.task = args.task
  # Examples are never truncated (a cut answer is unlearnable), so seq_len must hold the
  # longest with EOS: 34 bytes for addition at max_length 16, 167 for kv_retrieval at 16 pairs.
  data_config.seq_len = 192 if args.dataset == "kv_retrieval" else 64
  config = common.experiment_config(model, data_config, common.objective_config("seq2seq"),
                                    steps=600, batch_size=32, log_every=25, eval_every=200,
                                    checkpoint_every=200)
  config.opt.warmup_steps = 50
  return config
