"""The training job: `train_and_evaluate(config, workdir)`, which `python -m transformer.train`
runs; re-running the same command resumes (a finished run's re-run says so and touches no
file; one trainer per workdir, workdir_lock.py).

`train_and_evaluate(config, workdir)` is the whole job, top to bottom: check the config,
build mesh, data, model and optimizer, restore or initialize the sharded state, then a plain
loop that steps, logs, evaluates and checkpoints.
"""

import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer import data, schema
from transformer.analysis import model_stats
from transformer.model import models
from transformer.training import (checkpoint, init_from, losses, optim, preemption, profiling,
                                  run_log, sharding, throughput, train_state, workdir_cleanup,
                                  workdir_lock)
from transformer.training.step import make_eval_step, make_train_step
from transformer.data.shards import ShardedBatches
from transformer.training.run_log import RunLog, Stopwatch
# Re-exported: the entry points and experiments call them as loop.check_config / configure_host.
from transformer.training.config_checks import check_config
from transformer.training.host import configure_host  # noqa: F401  pylint: disable=unused-import


def evaluate(eval_step, params, config, tokenizer, mesh) -> dict:
  """Loss, perplexity and token accuracy over the first `train.eval_batches` eval batches.

  A fresh iterator each time, seeded by `train.eval_seed` (not `train.seed`), so every
  evaluation of every seed's run scores the same tokens."""
  batches = ShardedBatches(config, tokenizer, split=config.train.eval_split,
                           objective=config.objective.name, seed=config.train.eval_seed,
                           num_shards=config.train.data_shards)
  totals, token_bytes = None, data.token_bytes(tokenizer)
  for _ in range(config.train.eval_batches):
    sums = eval_step(params, sharding.global_batch(next(batches), mesh), token_bytes)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = jax.device_get(totals)
  loss = float(totals["nll_sum"] / max(totals["weight_sum"], 1.0))
  return {"eval_loss": loss, "eval_perplexity": float(np.exp(min(loss, 50.0))),
          "eval_accuracy": float(totals["correct_sum"] / max(totals["weight_sum"], 1.0)),
          # Bits per byte: comparable across tokenizers (None if the targets hold no text).
          "eval_bpb": (float(totals["nll_sum"] / totals["byte_sum"] / np.log(2))
                       if totals["byte_sum"] > 0 else None)}


def prepare_workdir(workdir: str) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise (checkpoint.disk_full(e, workdir) or ValueError(
        f"cannot write to --workdir {workdir}: {e.strerror or e}")) from None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Train per `config`, writing logs and checkpoints under `workdir`; returns the summary.

  A run that fails before logging a step or saving a checkpoint leaves no workdir behind if
  it made it, nor the parent folders it made for it, nor what it added to a folder that existed
  (workdir_cleanup.py). SIGINT/SIGTERM before the loop (or a second one in it) ends the
  process with one line on stderr and exit status 128 + the signal, after that same cleanup; a
  full disk anywhere is one line (checkpoint.DiskFull)."""
  before = workdir_cleanup.Before(workdir)
  lock = workdir_lock.WorkdirLock(workdir)  # taken once the config passed its checks
  with preemption.interruptible():
    try:
      return _train_and_evaluate(config, workdir, lock)
    except BaseException as e:
      pending = preemption.handled()
      with preemption.ignored():
        # Only the lock's holder cleans up: a trainer turned away by it would delete what the
        # holder wrote since `before` was taken.
        removed = lock.held and before.clean_up()
      if pending is not None and not isinstance(e, preemption.Interrupted):
        e = preemption.Interrupted(pending)  # the signal's Interrupted, turned into another error
      if isinstance(e, preemption.Interrupted):
        preemption.exit_interrupted(e, f"removed {workdir} (this run made it): re-run the same "
                                    f"command to start" if removed else None)
      full = None if isinstance(e, checkpoint.DiskFull) else checkpoint.disk_full(e, workdir)
      if full is not None:
        raise full from None
      raise
    finally:
      lock.release()


@dataclasses.dataclass(frozen=True)
class Built:
  """What a config builds, before any array exists: the model, its loss, the optimizer and
  schedule, the state's init function with its abstract shapes and shardings, and the jitted
  steps (trace them under `sharding.activate(mesh)`)."""
  model: Any
  loss_fn: Callable
  tx: Any
  schedule: Callable
  init: Callable
  param_shapes: Any
  abstract_state: Any
  state_shardings: Any
  train_step: Callable
  eval_step: Callable


def build(config: ml_collections.ConfigDict, mesh) -> Built:
  """Model, loss, optimizer, init and shardings for `config` on `mesh`, and the train and eval
  steps jitted with them (the training benchmark times exactly these)."""
  model = models.make_model(config.model)
  loss_fn = losses.make_loss_fn(config.objective, model)
  logical_names, param_shapes = train_state.abstract_params(model, config)
  tx = optim.make_optimizer(config.opt, config.train.steps,
                            optim.weight_decay_mask(logical_names, param_shapes))
  schedule = optim.make_schedule(config.opt, config.train.steps)
  init = train_state.make_init(model, config, tx)
  abstract_state, state_shardings = train_state.shardings(init, logical_names,
                                                          param_shapes, mesh)
  batch_sharding = sharding.batch_sharding(mesh)
  train_step = jax.jit(
      make_train_step(loss_fn, tx, schedule, config.opt.grad_accum_steps),
      in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, None),
      donate_argnums=0)
  eval_step = jax.jit(make_eval_step(loss_fn, config.objective.name),
                      in_shardings=(state_shardings["params"], batch_sharding,
                                    jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())))
  return Built(model, loss_fn, tx, schedule, init, param_shapes, abstract_state,
               state_shardings, train_step, eval_step)


def _open_checkpoints(config, workdir, lock):
  """The workdir's checkpoint manager and its latest step's config (None when new), once
  process 0 holds the workdir's lock (a second trainer there is refused). A checkpoint of
  another model or data stream, or one past train.steps, is refused before anything is
  built or written here (sentencepiece would train into the workdir)."""
  prepare_workdir(workdir)
  if jax.process_index() == 0:
    lock.acquire()
  checkpoint.set_aside_damaged(workdir, log=lambda line: print(line, flush=True))
  manager = checkpoint.make_manager(workdir, config.train.keep_checkpoints,
                                    config.train.keep_best, config.train.async_checkpoint)
  try:
    latest = manager.latest_step()
    saved_config = None
    if latest is not None:
      saved_config = checkpoint.read_config(manager, latest)
      checkpoint.check_compatible(saved_config, config, workdir)
      if latest > config.train.steps:
        raise ValueError(f"{workdir} holds a checkpoint of step {latest}, past "
                         f"train.steps={config.train.steps}; raise train.steps to at least "
                         f"{latest} or use a new --workdir")
  except BaseException:
    manager.close()
    raise
  return manager, latest, saved_config


def _finished_summary(config, workdir, latest) -> dict | None:
  """The summary of a run that already trained to train.steps (None if it has not): its
  re-run reports it and leaves every file as it was. Its final checkpoint must be there too:
  one set aside as damaged (or whose save failed) is trained again from an earlier one (with
  none left, run_log.check_fresh_start refuses)."""
  path = os.path.join(workdir, "summary.json")
  if latest != config.train.steps or not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return None  # unreadable: train (resume) and write it again
  return (summary if isinstance(summary, dict) and summary.get("step") == config.train.steps
          else None)


def _tokenizer(config, workdir):
  tokenizer = data.get_tokenizer(config.data, checkpoint.tokenizer_dir(workdir))
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ValueError(f"tokenizer {config.data.tokenizer!r} has {tokenizer.vocab_size} "
                     f"tokens but model.vocab_size is {config.model.vocab_size}")
  if config.objective.name == "mlm" and getattr(tokenizer, "mask_id", None) is None:
    raise ValueError(f"objective 'mlm' needs a mask token and tokenizer "
                     f"{config.data.tokenizer!r} has none: use data.tokenizer=bytes or "
                     f"sentencepiece, or a tokenizer.json with a <mask> / [MASK] token (or its "
                     f"id in special_ids.json beside it)")
  return tokenizer


def _restore_or_init(built, manager, latest, saved_config, train_batches, config, workdir,
                     source=None, mesh=None):
  """The state to train from: the latest checkpoint (and the data position with it), or
  `source`'s parameters with a fresh optimizer (train.init_from), or a fresh sharded init."""
  if latest is None and source is not None:
    params = init_from.restore_params(source, config, built, mesh)
    return jax.jit(train_state.make_init_from_params(built.tx),
                   out_shardings=built.state_shardings, donate_argnums=1)(
                       config.train.seed, params)
  if latest is None:
    return jax.jit(built.init, out_shardings=built.state_shardings)(config.train.seed)
  try:
    state, data_state = checkpoint.restore(manager, latest, built.abstract_state)
  except (ValueError, KeyError, TypeError) as e:
    # Orbax's tree mismatch names optimizer slots, not the settings that made them.
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    opt = checkpoint.differences(saved_config, config, lambda k: k.startswith("opt."))
    raise ValueError(f"{workdir}'s step-{latest} checkpoint does not restore into this "
                     f"config ({checkpoint.describe(opt) if opt else first}); use a new "
                     f"--workdir or the saved settings") from None
  train_batches.set_state(data_state)
  return state


def _open_log(config, workdir, manager, latest, saved_config) -> RunLog:
  """The run log; only called once the workdir's checkpoint restored into this config."""
  log = RunLog(workdir, config.train.steps, start_step=latest or 0,
               wandb_project=config.log.wandb_project)
  log.write_config(config)
  for note in log.notes:
    log.info(note)
  if latest is not None:
    log.info(f"resumed from step {latest} in {manager.directory}" + (
        f" (train.init_from={config.train.init_from} is not read again)"
        if config.train.init_from else ""))
    changed = checkpoint.differences(saved_config, config)
    if changed:
      log.info("changed since that checkpoint: " + ", ".join(
          f"{k} {a!r} -> {b!r}" for k, a, b in changed))
  return log


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, lock) -> dict:
  wall_start = time.time()
  # Checks that need no compute come first, so a typo costs seconds, not a compile.
  check_config(config)
  init_from.check_workdir(config, workdir)
  init_from.check_own_config(workdir)
  mesh = sharding.make_mesh(config.mesh.shape, config.train.batch_size,
                            config.opt.grad_accum_steps)
  sharding.check_batch_size(config.train.batch_size, mesh, config.opt.grad_accum_steps)
  manager, latest, saved_config = _open_checkpoints(config, workdir, lock)
  finished = _finished_summary(config, workdir, latest)
  if finished is not None:
    manager.close()
    checkpoint.check_finished_rerun(saved_config, config, workdir)
    if jax.process_index() == 0:
      print(f"{workdir} is finished: {config.train.steps} steps, eval loss "
            f"{finished.get('final_eval_loss')} (summary.json); nothing to do", flush=True)
    return finished
  dataset = data.built_name(config.data)
  if latest is not None:
    checkpoint.check_dataset(manager, latest, dataset, workdir)
  else:
    run_log.check_fresh_start(workdir)
  # A new run from another's parameters: checked against this model before any compute.
  source = (init_from.open_source(config) if latest is None and config.train.init_from
            else None)
  tokenizer_note = source and init_from.carry_tokenizer(source, config, workdir)
  tokenizer = _tokenizer(config, workdir)
  train_batches = ShardedBatches(config, tokenizer, split=config.train.train_split,
                                 objective=config.objective.name, seed=config.train.seed,
                                 num_shards=config.train.data_shards)
  # An empty eval slice fails here, not at the first evaluation after a stretch of training.
  data.load(config.data, config.train.eval_split)
  built = build(config, mesh)
  state = _restore_or_init(built, manager, latest, saved_config, train_batches, config,
                           workdir, source, mesh)
  lock.record_holder()  # like every write, only once the workdir's checkpoint restored
  log = _open_log(config, workdir, manager, latest, saved_config)
  if source is not None:
    log.info(f"initialized from {source.where}: parameters only (fresh optimizer state, "
             f"step 0, data from the start); {tokenizer_note}")

  params_total, params_non_embedding = model_stats.param_totals(built.param_shapes)
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
  unigram = floor = None
  if config.objective.name == "lm":
    unigram = data.unigram_entropy(config.data, tokenizer, config.train.eval_split,
                                   max_records=2000)
    log.info(f"unigram entropy of {config.data.name}/{config.train.eval_split}: "
             f"{unigram:.4f} nats/token")
    # A perfect model's loss (grammar_corpus, bytes tokenizer): the E of a scaling fit.
    floor = data.loss_floor(config.data, tokenizer, config.train.eval_split)
    if floor is not None:
      kind = "exact" if floor["exact"] else (f"a lower bound: rows of {config.data.seq_len} "
                                             f"cut {floor['cut_documents']} documents")
      log.info(f"loss floor of {config.data.name}/{config.train.eval_split}: "
               f"{floor['loss_floor']:.4f} nats/token ({kind}; {floor['documents']} documents"
               + ("" if floor["z"] == 1.0 else f"; documents redrawn above "
                  f"{config.data.max_doc_tokens} tokens, Z = {floor['z']:.6f}") + ")")

  start_step = int(state["step"])
  stop = preemption.StopSignal()
  stopwatch = Stopwatch()
  profile = profiling.StepProfiler(profiling.parse_steps(config.train.profile_steps,
                                                         config.train.steps), workdir,
                                     log.info, stopwatch.paused)
  train_step, compile_time_s = built.train_step, None
  window, eval_metrics, last_eval, last_bpb, previous = [], {}, None, None, None

  def log_row(step):
    fetched = jax.device_get(window)
    step_time = stopwatch.lap() / len(fetched)
    row = {"loss": float(np.mean([m["loss"] for m in fetched])),
           "accuracy": float(np.mean([m["accuracy"] for m in fetched])),
           "grad_norm": float(fetched[-1]["grad_norm"]),
           "learning_rate": float(fetched[-1]["learning_rate"]),
           "tokens": step * tokens_per_step,
           "tokens_per_s": tokens_per_step / step_time, "step_time_s": step_time,
           "wall_time_s": log.earlier_wall_time_s + time.time() - wall_start}
    if peak:
      row["mfu"] = flops_per_token * row["tokens_per_s"] / peak
    if step - len(fetched) == start_step:
      row["compile_time_s"] = compile_time_s  # the first row of each session
    row.update(eval_metrics)
    log.metrics(step, row)
    log.progress(step, row["loss"], row["tokens_per_s"], step_time, row.get("eval_loss"),
                 row.get("eval_bpb"))

  step = start_step
  try:
    with sharding.activate(mesh):
      for step in range(start_step + 1, config.train.steps + 1):
        batch = sharding.global_batch(next(train_batches), mesh)
        if compile_time_s is None:
          with stopwatch.paused() as timer:
            train_step = train_step.lower(state, batch).compile()
          compile_time_s = timer.seconds
          log.info(f"compiled the train step in {compile_time_s:.1f}s")
        # Wait for the previous step before queueing this one (its batch is ready, so the
        # device idles only for a dispatch): a step queued behind a running one holds its
        # own buffers, and on the CPU the two steps' temporaries then share the retained
        # heap, which doubled the train command's peak memory (docs/performance.md).
        if previous is not None and not bool(previous["finite"]):
          raise _non_finite(step - 1, previous, manager)
        state, metrics = profile(step, train_step, state, batch)
        window.append(metrics)
        log.tick(step)
        if checkpoint.save_ended(manager):  # a failed background save stops the run here
          # Hashing the saved step is the save's cost, not the step's: out of the step time,
          # once the step it would overlap with is done.
          jax.block_until_ready(metrics)
          with stopwatch.paused():
            checkpoint.finish(manager)
        previous = metrics

        stopping = stop.requested(step, config.train.log_every)
        eval_due = step % config.train.eval_every == 0 or step == config.train.steps
        save_due = step % config.train.checkpoint_every == 0 or step == config.train.steps
        if (eval_due or save_due or stopping) and not bool(metrics["finite"]):
          raise _non_finite(step, metrics, manager)
        if eval_due:
          with stopwatch.paused():
            eval_metrics = evaluate(built.eval_step, state["params"], config, tokenizer, mesh)
          last_eval, last_bpb = eval_metrics["eval_loss"], eval_metrics["eval_bpb"]
        if step % config.train.log_every == 0 or eval_due:
          log_row(step)
          window, eval_metrics = [], {}
        if save_due or stopping:
          with stopwatch.paused():
            data_state = checkpoint.gather_host_states(train_batches.get_state())
            checkpoint.save(manager, step, state, data_state, config,
                            eval_loss=last_eval if eval_due else None, force=True,
                            dataset=dataset)
        if stopping:
          checkpoint.finish(manager)
          log.info(f"stopped by {stop.received or 'a peer process'} at step {step}; "
                   f"checkpoint saved. Re-run the same command to resume.")
          return {"step": step, "stopped": True}

      if last_eval is None:  # nothing left to train: a re-run of a finished job
        final = evaluate(built.eval_step, state["params"], config, tokenizer, mesh)
        last_eval, last_bpb = final["eval_loss"], final["eval_bpb"]
    summary = {
        "final_eval_loss": last_eval,
        "final_eval_bpb": last_bpb,
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
        "wall_time_s": log.earlier_wall_time_s + time.time() - wall_start,  # all sessions
        "step": step,
        "compile_time_s": compile_time_s,
        "unigram_entropy": unigram,
        "loss_floor": None if floor is None else floor["loss_floor"],
        "loss_floor_exact": None if floor is None else floor["exact"],
        "loss_floor_z": None if floor is None else floor["z"],
        "config": schema.flatten(config.to_dict()),
    }
    checkpoint.finish(manager)  # the final checkpoint is on disk before the run says done
    log.summary(summary)
    versus = "" if unigram is None else f" (unigram entropy {unigram:.4f}" + (
        ")" if floor is None else f", loss floor {floor['loss_floor']:.4f})")
    log.info(f"done: eval loss {last_eval:.4f}{versus} after {step} steps")
    return summary
  finally:
    profile.close()
    stop.restore()
    checkpoint.close(manager, failing=sys.exc_info()[0] is not None)
    log.close()


def _non_finite(step: int, metrics: dict, manager) -> FloatingPointError:
  checkpoint.finish(manager)
  intact = checkpoint.newest_intact(manager)  # files checked: a damaged step is not "good"
  where = (f"the newest intact checkpoint is step {intact} in {manager.directory}"
           if intact is not None else "no intact checkpoint was saved yet")
  return FloatingPointError(
      f"loss {float(metrics['loss'])} / grad norm {float(metrics['grad_norm'])} is not "
      f"finite at step {step}; stopping ({where}). Lower opt.lr or raise opt.warmup_steps.")
