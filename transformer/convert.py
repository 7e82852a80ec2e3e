r"""Convert Hugging Face checkpoints to run directories and back.

    python -m transformer.convert --from_hf SRC_DIR --to WORKDIR   # HF directory -> a run dir
    python -m transformer.convert --from WORKDIR --to_hf DST_DIR   # and back

Nothing saved is overwritten: --to must be new or empty (writing step 0 into a training run
would prune its checkpoints), and --to_hf must hold no config.json, safetensors or checkpoints/.
The library is transformer/interop/hf.py.
"""

import jax
import numpy as np
from absl import flags
from flax.linen import meta

from transformer import cli
from transformer.interop import hf, workdirs

flags.DEFINE_string("from_hf", None, "Hugging Face checkpoint directory to import.")
flags.DEFINE_string("to", None, "Run directory to write (config.json + checkpoints/).")
flags.DEFINE_string("from", None, "Run directory whose checkpoint to export.")
flags.DEFINE_string("to_hf", None, "Directory to write config.json + model.safetensors to.")
flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"],
                  "Parameter and compute dtype of the imported model.")
FLAGS = flags.FLAGS
USAGE = "use --from_hf SRC_DIR --to WORKDIR, or --from WORKDIR --to_hf DST_DIR"


def main(argv):
  del argv
  src, out, workdir, dst = (FLAGS[k].value for k in ("from_hf", "to", "from", "to_hf"))
  if not ((src and out and not (workdir or dst)) or (workdir and dst and not (src or out))):
    raise ValueError(USAGE)
  _convert(src, out, workdir, dst)


def _convert(src, out, workdir, dst):
  if src:
    workdirs.check_new_workdir(out)  # before reading a possibly large checkpoint
    cfg, variables = hf.from_hf(src, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
    note = workdirs.save_workdir(cfg, variables, out, tokenizer_dir=src)
    print(f"{src} -> {out}: {cfg.kind}, {_count(variables):,} parameters; {note}")
  else:
    hf.check_new_hf_dir(dst)
    cfg, variables = workdirs.load_workdir(workdir, FLAGS.step, for_hf=True)
    hf.to_hf(cfg, variables, dst)
    note = workdirs.export_tokenizer(workdir, dst, cfg.kind)
    print(f"{workdir} -> {dst}: {hf.family_of(cfg).architecture}, {_count(variables):,} "
          f"parameters; {note}")


def _count(variables) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(meta.unbox(variables["params"])))


def run():
  """The `transformer-convert` console script."""
  cli.run(main)


if __name__ == "__main__":
  run()
