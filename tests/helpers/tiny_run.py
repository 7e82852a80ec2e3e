"""Tiny training runs for the tests: a config helper, and a subprocess entry point that can
stop itself at chosen moments (a signal at step k, SIGKILL halfway through a save).

    python tests/helpers/tiny_run.py --workdir W --data_dir D [--set train.steps=6 ...]
        [--signal_at_step 3:SIGTERM] [--kill_during_save_of_step 4] [--wait_for FILE]
        [--coordinator_address localhost:1234 --num_processes 2 --process_id 0]
        [--cpu_devices N]   (the train command's flag, through loop.configure_host)

Prints one JSON line {"losses": [...], "summary": {...}} on success.
"""

import argparse
import json
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def use_compilation_cache(directory: str) -> dict[str, str]:
  """Share compiled programs between the tests' many identical tiny runs (XLA:CPU compiles
  dominate their time); returns the environment that does the same for subprocesses."""
  import jax
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return dict(os.environ, JAX_COMPILATION_CACHE_DIR=directory,
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def tiny_data(data_dir, **overrides):
  """The data config of a built-in dataset at its tiny size under `data_dir` (grammar_corpus
  unless `name=` says otherwise)."""
  from transformer import data
  config = data.default_config()
  config.update(dict(size="tiny", data_dir=str(data_dir)) | overrides)
  return config


def tiny_config(data_dir: str, family: str = "lm", **overrides):
  """An xs model on the tiny corpus, 32-token rows, logging every step."""
  import importlib
  config = importlib.import_module(f"configs.{family}").get_config("size=xs")
  config.data.size = "tiny"
  config.data.data_dir = data_dir
  config.data.seq_len = 32
  config.model.max_len = 64
  config.train.update(dict(steps=3, batch_size=8, log_every=1, eval_every=1000,
                           checkpoint_every=1000, eval_batches=1, peak_flops=1e12))
  config.opt.warmup_steps = 2
  config.opt.lr = 1e-2
  for key, value in overrides.items():
    set_key(config, key, value)
  return config


def toy_state(value):
  """A train-state-shaped pytree for checkpoint tests, every parameter equal to `value`."""
  import jax  # deferred: the subprocess entry point below does not need it first
  import jax.numpy as jnp
  return {"params": {"w": jnp.full((2, 3), value)}, "opt_state": {"mu": jnp.zeros(3)},
          "step": jnp.array(value, jnp.int32), "rng": jax.random.key_data(jax.random.key(7))}


def set_key(config, dotted: str, value) -> None:
  *parents, leaf = dotted.split(".")
  for p in parents:
    config = config[p]
  if isinstance(value, str) and not isinstance(config[leaf], str):
    value = json.loads(value) if not isinstance(config[leaf], tuple) else tuple(json.loads(value))
  config[leaf] = value


def losses(workdir: str) -> dict[int, float]:
  """{step: training loss} from metrics.jsonl (the last entry wins, as after a resume)."""
  from transformer.training import metrics_file  # a torn last line: dropped, with a warning
  return {row["step"]: row["loss"] for row in metrics_file.read(
      os.path.join(workdir, "metrics.jsonl"))}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--family", default="lm")
  parser.add_argument("--set", action="append", default=[], help="dotted.key=json_value")
  parser.add_argument("--signal_at_step", default="")
  parser.add_argument("--kill_during_save_of_step", type=int, default=0)
  parser.add_argument("--wait_for", default="",
                      help="before the first train batch, wait until this file exists")
  parser.add_argument("--coordinator_address", default="")
  parser.add_argument("--num_processes", type=int, default=0)
  parser.add_argument("--process_id", type=int, default=-1)
  parser.add_argument("--cpu_devices", type=int, default=None)
  parser.add_argument("--sync_dispatch", action="store_true",
                      help="as the train command runs a large step: retained heap, "
                           "synchronous dispatch (transformer/training/host.py)")
  args = parser.parse_args()
  overrides = dict(item.split("=", 1) for item in args.set)
  config = tiny_config(args.data_dir, args.family, **overrides)

  if args.cpu_devices is not None:
    from transformer.training import loop
    loop.configure_host([config], cpu_devices=args.cpu_devices, retain_host_memory=False)
  if args.sync_dispatch:
    from transformer.training import host
    host.SYNC_DISPATCH_UNITS = 0  # every step counts as large
    host.configure_host([config])

  from transformer.training import sharding
  sharding.initialize_distributed(args.coordinator_address, args.num_processes,
                                  args.process_id)
  from transformer.data import shards
  from transformer.training import loop

  if args.signal_at_step:
    step, name = args.signal_at_step.split(":")
    # Raise the signal while the loop fetches the batch of step `step`: the loop finishes
    # that step, then checkpoints and exits.
    original_next = shards.ShardedBatches.__next__
    calls = {"n": 0}
    def next_then_signal(self):
      if self.split == "train":
        calls["n"] += 1
        if calls["n"] == int(step):
          os.kill(os.getpid(), getattr(signal, name))
      return original_next(self)
    shards.ShardedBatches.__next__ = next_then_signal

  if args.wait_for:
    # Hold the run inside the loop (the workdir locked, its files open) until told to go.
    import time
    waiting_next = shards.ShardedBatches.__next__
    def wait_then_next(self):
      while self.split == "train" and not os.path.exists(args.wait_for):
        time.sleep(0.1)
      return waiting_next(self)
    shards.ShardedBatches.__next__ = wait_then_next

  if args.kill_during_save_of_step:
    # Die after every file of that step is written but before orbax renames its temporary
    # directory into place: the most inconvenient moment for a restart.
    from orbax.checkpoint._src.path import atomicity
    original_finalize = atomicity.AtomicRenameTemporaryPath.finalize
    async def finalize_or_die(self):
      if self.get_final().name == str(args.kill_during_save_of_step):
        os.kill(os.getpid(), signal.SIGKILL)
      return await original_finalize(self)
    atomicity.AtomicRenameTemporaryPath.finalize = finalize_or_die

  summary = loop.train_and_evaluate(config, args.workdir)
  import jax
  out = {"summary": {k: v for k, v in summary.items() if k != "config"},
         "devices": jax.device_count(),
         "async_dispatch": jax.config.values["jax_cpu_enable_async_dispatch"]}
  if os.path.exists(os.path.join(args.workdir, "metrics.jsonl")):
    out["losses"] = losses(args.workdir)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
