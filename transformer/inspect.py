"""What a model config costs, without allocating its weights.

  python -m transformer.inspect --config configs/arch/llama3_8b.py [--json] [--length 100000]

The arithmetic is transformer/analysis/model_stats.py.
"""

import json

import jax
from absl import flags
from ml_collections import config_flags

from transformer import cli
from transformer.analysis.model_stats import DTYPE_BYTES, print_report, report

config_flags.DEFINE_config_file("config", None, "Config file with a `model` entry.")
flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")
flags.DEFINE_integer("length", None, "Sequence length for the length-dependent figures "
                     "(default: model.max_len).")
flags.DEFINE_enum("dtype", "bfloat16", sorted(DTYPE_BYTES), "KV-cache element type.")
flags.DEFINE_integer("new_tokens", 40, "Generated tokens for the comparison count.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  r = report(cli.config(FLAGS["config"]), FLAGS.length, FLAGS.dtype, FLAGS.new_tokens)
  if FLAGS.json:
    print(json.dumps(r, indent=1))
  else:
    print_report(r)


def run():
  """The `transformer-inspect` console script."""
  jax.config.update("jax_platforms", "cpu")
  cli.run(main, required=("config",))


if __name__ == "__main__":
  run()
