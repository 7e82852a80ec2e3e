"""Every mistake the train command can spot from the config alone, before any compute.

Each is a one-line ValueError naming the key and what to do, so a typo costs seconds rather
than a compile (train_and_evaluate calls this first; tests/bad_input_test.py covers it).
"""

import difflib
import math

from transformer import data, schema
from transformer.model import models, positions
from transformer.training import losses, optim, profiling, sharding, wandb_log


# Top-level blocks that programs other than the train command read (experiments/, launch/).
PROGRAM_BLOCKS = ("experiment", "sweep")


def check_keys(config) -> None:
  """Refuse a key that no block of the schema has. A mistyped `--config.data.seqlen=...` is
  refused when the flags are parsed (the loaded config is locked), but `data_config.seqlen =
  128` in a config file adds a key that nothing reads: the run would train at the default
  seq_len. Blocks beyond the schema's (an experiment's `experiment`, a sweep's `sweep`) are
  their programs' to check."""
  defaults = schema.experiment_config(schema.model_config(), data.default_config(),
                                      schema.objective_config("lm"))
  blocks = sorted([*defaults.keys(), *PROGRAM_BLOCKS])
  for block in config.keys():
    if block not in blocks:
      close = difflib.get_close_matches(block, blocks, n=1)
      raise ValueError(f"unknown config block {block!r}; "
                       + (f"did you mean {close[0]}?" if close else f"the blocks are "
                          f"{', '.join(blocks)}"))
    if block not in PROGRAM_BLOCKS:
      _check_block(config[block], defaults[block], block)


def _check_block(node, known, name: str) -> None:
  """Every key of config block `node` is one of `known`'s, nested blocks too."""
  for key in node.keys():
    if key not in known:
      close = difflib.get_close_matches(key, list(known.keys()), n=1)
      hint = f"did you mean {name}.{close[0]}?" if close else (
          f"{name} has {', '.join(sorted(known.keys()))}")
      raise ValueError(f"unknown config key {name}.{key}, which nothing reads; {hint}")
    if hasattr(known[key], "keys") and hasattr(node[key], "keys"):
      _check_block(node[key], known[key], f"{name}.{key}")


def check_config(config) -> None:
  """Every mistake we can spot from the config alone, each as a one-line error."""
  check_keys(config)
  models.validate(config.model)
  losses.check_config(config.objective, config.model.kind)
  optim.check_config(config.opt)
  t = config.train
  for key in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every",
              "eval_batches"):
    if t[key] < 1:
      raise ValueError(f"train.{key} must be >= 1, got {t[key]}")
  for key in ("keep_checkpoints", "keep_best"):
    if t[key] < 0:
      raise ValueError(f"train.{key} must be >= 0, got {t[key]}")
  if t.data_shards < 0:
    raise ValueError(f"train.data_shards must be >= 0 (0: one shard per process), "
                     f"got {t.data_shards}")
  sharding.check_shape(config.mesh.shape)
  # What the mesh's fixed data and fsdp entries already ask of the batch (a -1 entry is the
  # devices' share, checked once the mesh is built): a sweep's runs are checked before any
  # trains, so a batch the trainer would refuse is refused here.
  fixed = math.prod(n for n in config.mesh.shape[:2] if n > 0)
  if t.batch_size % (config.opt.grad_accum_steps * fixed):
    mesh = f" x {fixed} (mesh.shape's data x fsdp)" if fixed > 1 else ""
    raise ValueError(f"train.batch_size={t.batch_size} is not divisible by "
                     f"opt.grad_accum_steps={config.opt.grad_accum_steps}{mesh}")
  if t.data_shards and t.batch_size % t.data_shards:
    raise ValueError(f"train.batch_size={t.batch_size} is not divisible by "
                     f"train.data_shards={t.data_shards}")
  if t.keep_checkpoints == 0 and t.keep_best == 0:
    # Orbax would delete every save: a stopped run would restart from step 0.
    raise ValueError("train.keep_checkpoints=0 with train.keep_best=0 keeps no checkpoint; "
                     "keep at least one (train.keep_checkpoints >= 1)")
  limit = positions.make_scheme(config.model).max_length()
  if config.data.seq_len > limit:
    raise ValueError(f"data.seq_len={config.data.seq_len} exceeds what "
                     f"model.position.name={config.model.position.name!r} allows "
                     f"({limit}, model.max_len); raise model.max_len or use a relative scheme")
  data.validate(config.data, config.objective.name, model_vocab_size=config.model.vocab_size,
                splits={"train.train_split": config.train.train_split,
                        "train.eval_split": config.train.eval_split})
  profiling.parse_steps(config.train.profile_steps, t.steps)
  wandb_log.check_config(config.log.wandb_project)
