r"""Train a model from an experiment config; re-running the same command resumes.

    python -m transformer.train --config configs/lm.py:size=xs --workdir runs/a \
        [--config.opt.lr=1e-3 ...] [--coordinator_address=host:port --num_processes=N
        --process_id=i]

`train_and_evaluate(config, workdir)` is the whole job, top to bottom: check the config,
build mesh, data, model and optimizer, restore or initialize the sharded state, then a plain
loop that steps, logs, evaluates and checkpoints.
"""

import os
import shutil
import signal
import time
import traceback
from typing import Sequence

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils
from ml_collections import config_flags

from transformer import (checkpoint, cli, data, host_memory, inspect, models, objectives,
                         optim, positions, sharding, throughput, train_state)
from transformer.data_shards import ShardedBatches
from transformer.metrics_log import RunLog, Stopwatch

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:args].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: logs and checkpoints.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", "", "host:port of process 0, "
                                   "for multi-process runs outside TPU pods and SLURM.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index in the job.")
_RETAIN_HOST_MEMORY = flags.DEFINE_bool(
    "retain_host_memory", True, "Reuse freed host memory instead of returning it to the "
    "kernel: ~1.5x faster CPU steps, at up to ~2x peak RSS (transformer/host_memory.py).")
_CPU_DEVICES = flags.DEFINE_integer(
    "cpu_devices", 1, "XLA:CPU devices to split this process's cores into, data-parallel "
    "over the mesh's -1 axis: 1 = one device using every core; 0 = one per core, or the most "
    "the config's mesh and batch divide evenly (W1's step about the same, W2's ~5% faster, "
    "the quickstart's ~5% slower; README 'Parallelism'). Ignored when XLA_FLAGS "
    "sets --xla_force_host_platform_device_count; other backends are unaffected.")


def make_train_step(loss_fn, tx, schedule, accum_steps: int):
  """One optimizer update from a global batch, averaging over its real tokens."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state, batch):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
    if accum_steps == 1:
      (loss_sum, sums), grad_sums = grad_fn(state["params"], batch, rng, False)
    else:
      # Micro-batch m takes rows m, m+A, m+2A, ...: every device keeps its own rows, so
      # splitting moves no data between devices.
      micro = jax.tree.map(
          lambda x: x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:])
          .swapaxes(0, 1), batch)

      def add_micro(carry, index_and_batch):
        index, micro_batch = index_and_batch
        out = grad_fn(state["params"], micro_batch, jax.random.fold_in(rng, index), False)
        return jax.tree.map(jnp.add, carry, out), None
      zeros = jax.eval_shape(grad_fn, state["params"], jax.tree.map(lambda x: x[0], micro),
                             rng, False)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
      ((loss_sum, sums), grad_sums), _ = jax.lax.scan(
          add_micro, zeros, (jnp.arange(accum_steps), micro))
    # Sums over all micro-batches and devices divided once: the loss per real token.
    count = jnp.maximum(sums["weight_sum"], 1.0)
    grads = jax.tree.map(lambda g: g / count, grad_sums)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    grad_norm = optax.tree.norm(grads)
    metrics = {"loss": loss_sum / count, "accuracy": sums["correct_sum"] / count,
               "grad_norm": grad_norm, "learning_rate": schedule(state["step"]),
               "real_tokens": sums["weight_sum"],
               # Params after this step are good iff the loss and gradients were finite.
               "finite": jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)}
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1,
                 "rng": state["rng"]}
    return new_state, metrics

  return train_step


def make_eval_step(loss_fn):
  def eval_step(params, batch):
    _, sums = loss_fn(params, batch, jax.random.key(0), True)
    return sums
  return eval_step


def evaluate(eval_step, params, config, tokenizer, mesh) -> dict:
  """Loss, perplexity and token accuracy over the first `train.eval_batches` eval batches.

  A fresh iterator each time, so every evaluation scores the same tokens."""
  batches = ShardedBatches(config, tokenizer, split=config.train.eval_split,
                           objective=config.objective.name, seed=config.train.seed,
                           num_shards=config.train.data_shards)
  totals = None
  for _ in range(config.train.eval_batches):
    sums = eval_step(params, sharding.global_batch(next(batches), mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = jax.device_get(totals)
  loss = float(totals["nll_sum"] / max(totals["weight_sum"], 1.0))
  return {"eval_loss": loss, "eval_perplexity": float(np.exp(min(loss, 50.0))),
          "eval_accuracy": float(totals["correct_sum"] / max(totals["weight_sum"], 1.0))}


def check_config(config) -> None:
  """Every mistake we can spot from the config alone, each as a one-line error."""
  models.validate(config.model)
  objectives.check_config(config.objective, config.model.kind)
  optim.check_config(config.opt)
  t = config.train
  for key in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every"):
    if t[key] < 1:
      raise ValueError(f"train.{key} must be >= 1, got {t[key]}")
  limit = positions.make_scheme(config.model).max_length()
  if config.data.seq_len > limit:
    raise ValueError(f"data.seq_len={config.data.seq_len} exceeds what "
                     f"model.position.name={config.model.position.name!r} allows "
                     f"({limit}, model.max_len); raise model.max_len or use a relative scheme")
  data.validate(config.data, config.objective.name, model_vocab_size=config.model.vocab_size,
                splits=(config.train.train_split, config.train.eval_split))


def prepare_workdir(workdir: str) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"cannot write to --workdir {workdir}: {e.strerror or e}") from None


class StopSignal:
  """Turns SIGTERM/SIGINT into a request to checkpoint and exit at the next step boundary.

  A second signal of either kind falls back to the default (immediate) behaviour."""

  def __init__(self):
    self.received = None
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    self.received = signal.Signals(signum).name
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def requested(self) -> bool:
    if jax.process_count() == 1:
      return self.received is not None
    # Any host's signal stops every host at the same step, or the save would deadlock.
    flags_ = multihost_utils.process_allgather(np.array(self.received is not None))
    return bool(np.any(flags_))

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      if signal.getsignal(sig) == self._handle:
        signal.signal(sig, handler)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Train per `config`, writing logs and checkpoints under `workdir`; returns the summary.

  A run that fails before logging a step or saving a checkpoint leaves no workdir behind if
  it made it (what it wrote by then, config.json and empty logs, says nothing)."""
  made = not os.path.exists(workdir)
  try:
    return _train_and_evaluate(config, workdir)
  except BaseException:
    if made and jax.process_index() == 0 and not _holds_results(workdir):
      shutil.rmtree(workdir, ignore_errors=True)
    raise


def _holds_results(workdir: str) -> bool:
  metrics = os.path.join(workdir, "metrics.jsonl")
  checkpoints = os.path.join(workdir, "checkpoints")
  return ((os.path.exists(metrics) and os.path.getsize(metrics) > 0) or
          (os.path.isdir(checkpoints) and any(os.scandir(checkpoints))))


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  wall_start = time.time()
  # Checks that need no compute come first, so a typo costs seconds, not a compile.
  check_config(config)
  mesh = sharding.make_mesh(config.mesh.shape, config.train.batch_size,
                            config.opt.grad_accum_steps)
  sharding.check_batch_size(config.train.batch_size, mesh, config.opt.grad_accum_steps)
  prepare_workdir(workdir)
  # A checkpoint of another model or data stream is refused before anything is built or
  # written here (sentencepiece would train into the workdir).
  manager = checkpoint.make_manager(workdir, config.train.keep_checkpoints,
                                    config.train.keep_best, config.train.async_checkpoint)
  latest = manager.latest_step()
  if latest is not None:
    saved_config = checkpoint.read_config(manager, latest)
    checkpoint.check_compatible(saved_config, config, workdir)
  tokenizer = data.get_tokenizer(config.data, checkpoint.tokenizer_dir(workdir))
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ValueError(f"tokenizer {config.data.tokenizer!r} has {tokenizer.vocab_size} "
                     f"tokens but model.vocab_size is {config.model.vocab_size}")
  train_batches = ShardedBatches(config, tokenizer, split=config.train.train_split,
                                 objective=config.objective.name, seed=config.train.seed,
                                 num_shards=config.train.data_shards)
  model = models.make_model(config.model)
  loss_fn = objectives.make_loss_fn(config.objective, model)
  logical_names, param_shapes = train_state.abstract_params(model, config)
  tx = optim.make_optimizer(config.opt, config.train.steps,
                            optim.weight_decay_mask(logical_names, param_shapes))
  schedule = optim.make_schedule(config.opt, config.train.steps)
  init = train_state.make_init(model, config, tx)
  abstract_state, state_shardings = train_state.shardings(init, logical_names,
                                                          param_shapes, mesh)

  # Resume if this workdir has a checkpoint.
  if latest is not None:
    try:
      state, data_state = checkpoint.restore(manager, latest, abstract_state)
      train_batches.set_state(data_state)
    except (ValueError, KeyError, TypeError) as e:
      # Orbax's tree mismatch names optimizer slots, not the settings that made them.
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      opt = checkpoint.differences(saved_config, config, lambda k: k.startswith("opt."))
      raise ValueError(f"{workdir}'s step-{latest} checkpoint does not restore into this "
                       f"config ({checkpoint.describe(opt) if opt else first}); use a new "
                       f"--workdir or the saved settings") from None
  else:
    state = jax.jit(init, out_shardings=state_shardings)(config.train.seed)
  # Only now, with the workdir's checkpoint restored into this config, do we write into it.
  log = RunLog(workdir, config.train.steps)
  log.write_config(config)
  if latest is not None:
    log.info(f"resumed from step {latest} in {manager.directory}")
    changed = checkpoint.differences(saved_config, config)
    if changed:
      log.info("changed since that checkpoint: " + ", ".join(
          f"{k} {a!r} -> {b!r}" for k, a, b in changed))

  params_total, params_non_embedding = inspect.param_totals(param_shapes)
  tokens_per_step = config.train.batch_size * config.data.seq_len
  flops_per_token = throughput.flops_per_token(config.model, config.data.seq_len,
                                               params_non_embedding)
  flops_per_token_total = throughput.flops_per_token(config.model, config.data.seq_len,
                                                     params_non_embedding, params_total,
                                                     convention="total")
  peak = throughput.peak_flops(config.train.peak_flops)
  log.info(f"{config.model.kind}: {params_total:,} params ({params_non_embedding:,} "
           f"non-embedding), mesh {dict(mesh.shape)}, {tokens_per_step:,} tokens/step")
  # The loss of a model that learned token frequencies and nothing else: the bar an LM's
  # eval loss must clear to show it uses context.
  unigram = None
  if config.objective.name == "lm":
    unigram = data.unigram_entropy(config.data, tokenizer, config.train.eval_split,
                                   max_records=2000)
    log.info(f"unigram entropy of {config.data.name}/{config.train.eval_split}: "
             f"{unigram:.4f} nats/token")

  with sharding.activate(mesh):
    batch_sharding = sharding.batch_sharding(mesh)
    train_step = jax.jit(make_train_step(loss_fn, tx, schedule, config.opt.grad_accum_steps),
                         in_shardings=(state_shardings, batch_sharding),
                         out_shardings=(state_shardings, None), donate_argnums=0)
    eval_step = jax.jit(make_eval_step(loss_fn),
                        in_shardings=(state_shardings["params"], batch_sharding))

    start_step = int(state["step"])
    stop = StopSignal()
    window, eval_metrics, last_eval, previous = [], {}, None, None
    compile_time_s = None
    stopwatch = Stopwatch()
    step = start_step
    try:
      for step in range(start_step + 1, config.train.steps + 1):
        batch = sharding.global_batch(next(train_batches), mesh)
        if compile_time_s is None:
          compile_start = time.perf_counter()
          train_step = train_step.lower(state, batch).compile()
          compile_time_s = time.perf_counter() - compile_start
          log.info(f"compiled the train step in {compile_time_s:.1f}s")
          stopwatch.pause(compile_time_s)
        state, metrics = train_step(state, batch)
        window.append(metrics)

        # Reading the previous step's flag waits only for that step: the device already
        # has this one queued, so the check costs no idle time.
        if previous is not None and not bool(previous["finite"]):
          raise _non_finite(step - 1, previous, manager)
        previous = metrics

        stopping = stop.requested()
        eval_due = step % config.train.eval_every == 0 or step == config.train.steps
        save_due = step % config.train.checkpoint_every == 0 or step == config.train.steps
        if (eval_due or save_due or stopping) and not bool(metrics["finite"]):
          raise _non_finite(step, metrics, manager)
        if eval_due:
          eval_start = time.perf_counter()
          eval_metrics = evaluate(eval_step, state["params"], config, tokenizer, mesh)
          last_eval = eval_metrics["eval_loss"]
          stopwatch.pause(time.perf_counter() - eval_start)

        if step % config.train.log_every == 0 or eval_due:
          fetched = jax.device_get(window)
          step_time = stopwatch.lap() / len(fetched)
          tokens_per_s = tokens_per_step / step_time
          row = {"loss": float(np.mean([m["loss"] for m in fetched])),
                 "accuracy": float(np.mean([m["accuracy"] for m in fetched])),
                 "grad_norm": float(fetched[-1]["grad_norm"]),
                 "learning_rate": float(fetched[-1]["learning_rate"]),
                 "tokens": step * tokens_per_step,
                 "tokens_per_s": tokens_per_s, "step_time_s": step_time}
          if peak:
            row["mfu"] = flops_per_token * tokens_per_s / peak
          if step - len(fetched) == start_step:
            row["compile_time_s"] = compile_time_s  # the first row of each session
          row.update(eval_metrics)
          log.metrics(step, row)
          log.progress(step, row["loss"], tokens_per_s, step_time,
                       eval_metrics.get("eval_loss"))
          window, eval_metrics = [], {}

        if save_due or stopping:
          save_start = time.perf_counter()
          data_state = checkpoint.gather_host_states(train_batches.get_state())
          checkpoint.save(manager, step, state, data_state, config,
                          eval_loss=last_eval if eval_due else None, force=True)
          stopwatch.pause(time.perf_counter() - save_start)
        if stopping:
          manager.wait_until_finished()
          log.info(f"stopped by {stop.received or 'a peer process'} at step {step}; "
                   f"checkpoint saved. Re-run the same command to resume.")
          return {"step": step, "stopped": True}

      if last_eval is None:  # nothing left to train: a re-run of a finished job
        last_eval = evaluate(eval_step, state["params"], config, tokenizer, mesh)["eval_loss"]
      summary = {
          "final_eval_loss": last_eval,
          "params_total": params_total,
          "params_non_embedding": params_non_embedding,
          "tokens": config.train.steps * tokens_per_step,
          "flops_per_token": flops_per_token,
          "flops": flops_per_token * config.train.steps * tokens_per_step,
          # The same run counted as Chinchilla / Porian et al. do: N with the tied
          # embedding = output projection (experiments/scaling/shapes.py, both conventions).
          "flops_per_token_total": flops_per_token_total,
          "flops_total": flops_per_token_total * config.train.steps * tokens_per_step,
          "flops_convention": "non_embedding (flops, flops_per_token); total "
                              "(flops_total, flops_per_token_total)",
          "wall_time_s": time.time() - wall_start,
          "step": step,
          "compile_time_s": compile_time_s,
          "unigram_entropy": unigram,
          "config": checkpoint.flatten(config.to_dict()),
      }
      log.summary(summary)
      versus = "" if unigram is None else f" (unigram entropy {unigram:.4f})"
      log.info(f"done: eval loss {last_eval:.4f}{versus} after {step} steps")
      return summary
    finally:
      stop.restore()
      manager.wait_until_finished()
      manager.close()
      log.close()


def _non_finite(step: int, metrics: dict, manager) -> FloatingPointError:
  manager.wait_until_finished()
  latest = manager.latest_step()
  where = (f"the last good checkpoint is step {latest} in {manager.directory}"
           if latest is not None else "no checkpoint was saved yet")
  return FloatingPointError(
      f"loss {float(metrics['loss'])} / grad norm {float(metrics['grad_norm'])} is not "
      f"finite at step {step}; stopping ({where}). Lower opt.lr or raise opt.warmup_steps.")


def configure_host(configs: Sequence[ml_collections.ConfigDict] = ()) -> bool:
  """Process-wide settings from this command's flags, for every program that trains through
  it (the experiments too). Call before JAX's first computation starts its threads.

  `configs`: the runs this process will train, which `--cpu_devices=0` fits the device
  count to (with none, one device). True if freed host memory is now retained."""
  if _CPU_DEVICES.value < 0:
    raise ValueError(f"--cpu_devices={_CPU_DEVICES.value}: use 0 (one per core) or a count")
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = _CPU_DEVICES.value or min(
        [sharding.cpu_device_count(c.mesh.shape, c.train.batch_size, c.opt.grad_accum_steps,
                                   cores, max(_NUM_PROCESSES.value, 1)) for c in configs]
        or [1])
    jax.config.update("jax_num_cpu_devices", count)
  return _RETAIN_HOST_MEMORY.value and host_memory.retain_freed_memory()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = cli.config(_CONFIG)
  if config is None or not _WORKDIR.value:
    raise app.UsageError("--config and --workdir are required")
  if not flags.FLAGS["verbosity"].present:
    # The progress lines are the console output; orbax and friends log every save at INFO.
    logging.set_verbosity(logging.WARNING)
  try:
    configure_host([config])
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  try:
    train_and_evaluate(config, _WORKDIR.value)
  except (ValueError, FloatingPointError, FileNotFoundError) as e:
    # Config and data mistakes are the user's to fix: one line; --verbosity=1 adds the trace.
    logging.debug("%s", traceback.format_exc())
    raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
