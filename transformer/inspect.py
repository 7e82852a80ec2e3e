"""What a model config costs, without allocating its weights.

  python -m transformer.inspect --config configs/arch/llama3_8b.py [--json] [--length 100000]
  python -m transformer.inspect --workdir runs/gpt2          # a trained or converted run

The arithmetic is transformer/analysis/model_stats.py.
"""

import json
import os

import jax
import ml_collections
from absl import flags
from ml_collections import config_flags

from transformer import cli
from transformer.analysis.model_stats import DTYPE_BYTES, print_report, report
from transformer.training import init_from

config_flags.DEFINE_config_file("config", None, "Config file with a `model` entry.")
flags.DEFINE_string("workdir", None, "Instead of --config: a run directory, as the train or "
                    "convert command wrote it (its config.json).")
flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")
flags.DEFINE_integer("length", None, "Sequence length for the KV-cache and score-matrix "
                     "figures (default: model.max_len). Training FLOPs per token use the "
                     "training context: data.seq_len where the config has one.")
flags.DEFINE_enum("dtype", "bfloat16", sorted(DTYPE_BYTES), "KV-cache element type.")
flags.DEFINE_integer("new_tokens", 40, "Generated tokens for the comparison count.")
FLAGS = flags.FLAGS


def workdir_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run (or a converted checkpoint) was written with."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} not found; --workdir takes a directory the train or "
                            f"convert command wrote")
  # A Hugging Face directory's config.json has no model block: one line saying to convert it.
  return ml_collections.ConfigDict(init_from.read_run_config(workdir, "--workdir"))


def main(argv):
  del argv
  if FLAGS["config"].present == bool(FLAGS.workdir):
    raise ValueError("pass one of --config CONFIG_FILE or --workdir RUN_DIR")
  cfg = workdir_config(FLAGS.workdir) if FLAGS.workdir else cli.config(FLAGS["config"])
  r = report(cfg, FLAGS.length, FLAGS.dtype, FLAGS.new_tokens)
  if FLAGS.json:
    print(json.dumps(r, indent=1))
  else:
    print_report(r)


def run():
  """The `transformer-inspect` console script."""
  jax.config.update("jax_platforms", "cpu")
  cli.run(main)


if __name__ == "__main__":
  run()
