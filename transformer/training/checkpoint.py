"""Orbax checkpoints of a training run: what is saved, when it is kept, how it is found again.

A checkpoint at step k holds everything needed to continue exactly as if never stopped:
  params       the model parameters (restorable alone, for inference)
  train_state  optimizer state, step counter and the base RNG key
  data         every data shard's iterator position (JSON, written by process 0)
  meta         the full experiment config, to refuse resuming a different model
Orbax writes each step into a temporary directory and renames it only once complete, so a
process killed mid-save leaves the previous checkpoint as the latest one; each complete step
then gets a sha256 record, checked before a resume (checkpoint_integrity.py). A save that
fails for lack of space (ENOSPC, synchronous or async) stops the run with one line that names
the folder and the space left, the last complete checkpoint untouched (disk_space.py).
"""

import json
import logging
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers

from transformer import schema
from transformer.training import checkpoint_integrity, disk_space

DiskFull, disk_full, free_space = disk_space.DiskFull, disk_space.disk_full, disk_space.free_space


class _NoMetricsWarningFilter(logging.Filter):
  """Saves between evals carry no eval loss by design (keep-best ignores them); orbax warns
  about each one."""

  def filter(self, record):
    return "did not provide metrics" not in record.getMessage()


class _ReadOnlyNoiseFilter(logging.Filter):
  """Orbax warns three times that the read-only manager it was asked for is read only."""

  def filter(self, record):
    return not record.getMessage().startswith(("CheckpointManagerOptions.read_only=True",
                                               "Given directory is read only"))


def _filter_once(logger, cls) -> None:
  if not any(isinstance(f, cls) for f in logger.filters):
    logger.addFilter(cls())


def read_only_manager(workdir: str) -> ocp.CheckpointManager:
  """A manager that reads a run's checkpoints (inference, conversion, train.init_from) and
  never writes."""
  _filter_once(absl_logging.get_absl_logger(), _ReadOnlyNoiseFilter)
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                               options=ocp.CheckpointManagerOptions(read_only=True))


def readable_step(manager, step: int | None, workdir: str, choose: str = "pass --step") -> int:
  """The latest (or given) step of a read-only manager, refused in one line when it is
  missing or damaged, naming the steps there are (and `choose`: how to pick another)."""
  saved = sorted(manager.all_steps())
  step = (saved[-1] if saved else None) if step is None else step  # one listing, not two
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {workdir}/checkpoints")
  if step not in saved:
    raise FileNotFoundError(f"no checkpoint of step {step} under {workdir}/checkpoints; "
                            f"saved steps: {saved}")
  step_dir = os.path.join(str(manager.directory), str(step))
  damage = checkpoint_integrity.problem(step_dir)
  if (damage is None and jax.process_count() == 1
      and not os.path.exists(os.path.join(step_dir, checkpoint_integrity.SUMS))):
    # No sums recorded (the trainer stopped between the save and its record): read it back,
    # as the trainer does before resuming from such a step.
    damage = checkpoint_integrity.unreadable(step_dir)
  if damage is not None:
    raise ValueError(f"the step-{step} checkpoint in {manager.directory} is damaged ({damage}); "
                     f"{choose} with another of {saved}")
  return step


def make_manager(workdir: str, keep: int = 3, keep_best: int = 1,
                 async_save: bool = True) -> ocp.CheckpointManager:
  """Keeps the last `keep` checkpoints plus the `keep_best` lowest eval losses."""
  logger = absl_logging.get_absl_logger()
  _filter_once(logger, _NoMetricsWarningFilter)
  _filter_once(logger, disk_space.DiskFullNoiseFilter)
  # asyncio logs a failed write's never-retrieved future when it is collected (at exit).
  _filter_once(logging.getLogger("asyncio"), disk_space.DiskFullNoiseFilter)
  disk_space.drop_abandoned_write_noise()
  # The latest save is always kept, whatever `keep` says: it is the one a stopped run
  # resumes from (keep=0 with keep_best=1 would otherwise delete a stop's checkpoint).
  policies = [checkpoint_managers.LatestN(n=max(keep, 1))]
  if keep_best > 0:
    policies.append(checkpoint_managers.BestN(
        get_metric_fn=lambda m: m["eval_loss"], reverse=True, n=keep_best,
        keep_checkpoints_without_metrics=False))
  options = ocp.CheckpointManagerOptions(
      preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
      # best_fn also makes the manager store each save's metrics next to it.
      best_fn=lambda m: m["eval_loss"], best_mode="min",
      enable_async_checkpointing=async_save,
      create=True)
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                               options=options)


def save(manager, step: int, state: dict, data_state: dict, config, eval_loss=None,
         force: bool = False, dataset: str | None = None) -> bool:
  """Start an (async) save of the train state, data positions and config at `step`, once the
  previous save is complete and recorded (`finish`; orbax's save would wait for it anyway).
  `dataset` (sources.built_name) names the data the positions index (check_dataset)."""
  finish(manager)
  disk_space.check_space(manager, step, state)
  metrics = None if eval_loss is None else {"eval_loss": float(eval_loss)}
  args = ocp.args.Composite(
      params=ocp.args.StandardSave(state["params"]),
      train_state=ocp.args.StandardSave(
          {k: v for k, v in state.items() if k != "params"}),
      data=ocp.args.JsonSave(data_state),
      meta=ocp.args.JsonSave({"config": json.loads(config.to_json())}
                             | ({"dataset": dataset} if dataset else {})))
  try:
    saved = manager.save(step, args=args, metrics=metrics, force=force)
  except Exception as e:  # pylint: disable=broad-except
    raise disk_space.save_failed(e, manager) or e
  _in_flight.add(id(manager))
  return saved


_in_flight: set[int] = set()  # id() of the managers with a save not yet `finish`ed


def finish(manager) -> None:
  """Wait for the save in flight; raise DiskFull (one line) if it failed for lack of space;
  then record the sha256 sums of every complete step that has none (process 0)."""
  _in_flight.discard(id(manager))
  try:
    manager.wait_until_finished()
  except Exception as e:  # pylint: disable=broad-except
    raise disk_space.save_failed(e, manager) or e
  if jax.process_index() == 0:
    steps = checkpoint_integrity.step_dirs(str(manager.directory))
    for step in manager.all_steps():
      if step in steps:
        checkpoint_integrity.record(steps[step])


def save_ended(manager) -> bool:
  """Per step: whether a background save has ended and awaits `finish`, so that a failed one
  stops the run at once instead of at the next save, and the sums are recorded meanwhile."""
  return id(manager) in _in_flight and not manager.is_saving_in_progress()


def close(manager, failing: bool = False) -> None:
  """`finish`, then close; while another error propagates (`failing`), a failing save of
  this manager only adds noise, so its errors are dropped."""
  try:
    finish(manager)
    manager.close()
  except Exception:  # pylint: disable=broad-except
    if not failing:
      raise


def set_aside_damaged(workdir: str, log=print) -> list[int]:
  """checkpoint_integrity.set_aside_damaged on process 0, the others waiting for it."""
  damaged = []
  if jax.process_index() == 0:
    damaged = checkpoint_integrity.set_aside_damaged(
        workdir, log, single_process=jax.process_count() == 1)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("checkpoint_integrity")
  return damaged


def newest_intact(manager) -> int | None:
  """The newest step whose files match their record (after a NaN, the one to go back to)."""
  steps = checkpoint_integrity.step_dirs(str(manager.directory))
  for step in sorted(manager.all_steps(), reverse=True):
    if step in steps and checkpoint_integrity.problem(steps[step]) is None:
      return step
  return None


def read_meta(manager, step: int) -> dict:
  """{"config": ..., "dataset": ...} as `save` wrote them (older steps lack "dataset")."""
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta


def read_config(manager, step: int) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(read_meta(manager, step)["config"])


def check_dataset(manager, step: int, dataset: str | None, directory: str) -> None:
  """Refuse to resume data positions into other data: the same data keys can build another
  dataset (text_folder files added or edited, python_stdlib on another Python), and the
  saved positions would then continue the run on records it was not training on."""
  saved = read_meta(manager, step).get("dataset")
  if saved and dataset and saved != dataset:
    raise ValueError(f"{directory}'s step-{step} checkpoint was trained on {saved}, but these "
                     f"settings build {dataset} (the data it reads changed: files under "
                     f"data.path, or the Python version); restore that data to resume, or "
                     f"start a new --workdir from its parameters with "
                     f"train.init_from={directory}")




def differences(saved_config, config, keys=None) -> list[tuple[str, Any, Any]]:
  """(key, saved, now) for the flat keys that differ; `keys` filters by name."""
  # JSON (the saved config) has no tuples: compare (-1, 1, 1) and [-1, 1, 1] as equal.
  saved, now = ({k: tuple(v) if isinstance(v, list) else v for k, v in schema.flatten(c).items()}
                for c in (saved_config.to_dict(), config.to_dict()))
  return [(k, saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now))
          if saved.get(k) != now.get(k) and (keys is None or keys(k))]


def describe(diffs, limit: int = 4) -> str:
  shown = ", ".join(f"{k}: {a!r} saved vs {b!r} now" for k, a, b in diffs[:limit])
  return shown + (", ..." if len(diffs) > limit else "")


def check_compatible(saved_config, config, directory: str) -> None:
  """Refuse to resume a checkpoint of another model or another data stream, naming the
  keys that differ. Keys an older checkpoint's config lacks are not compared for the data
  stream (they were added since, with defaults that keep the old behaviour)."""
  model = differences(saved_config, config, lambda k: k.startswith("model.") and
                      k.split(".", 1)[1] not in schema.COMPUTE_KEYS)
  functions = [schema.attention_function(c.model) for c in (saved_config, config)]
  if functions[0] != functions[1]:  # an approximation is another model, not another kernel
    model.append(("model.attention", *functions))
  if model:
    raise ValueError(f"{directory} holds a checkpoint of a different model "
                     f"({describe(model)}); use a new --workdir or the saved config")
  saved_keys = set(schema.flatten(saved_config.to_dict()))
  stream = differences(saved_config, config, lambda k: k in saved_keys and (
      k in schema.STREAM_KEYS or k.startswith("data.") and k not in schema.RELOCATABLE_DATA_KEYS))
  if stream:
    raise ValueError(f"{directory} holds a checkpoint of a different data stream "
                     f"({describe(stream)}); its data position would continue another "
                     f"experiment: use a new --workdir or the saved settings")


# Keys of a finished run's config that say where it ran or how it was logged, checkpointed or
# laid out, not what it learned: a re-run that changes only these is the same finished run.
# The experiments' skip-if-finished checks (experiments/extrapolation/run.py) use this list.
BOOKKEEPING_KEYS = (("train.log_every", "train.eval_every", "train.checkpoint_every",
                     "train.keep_checkpoints", "train.keep_best", "train.async_checkpoint",
                     "train.peak_flops", "train.profile_steps", "log.wandb_project",
                     "mesh.shape")
                    + schema.RELOCATABLE_DATA_KEYS
                    + tuple(f"model.{k}" for k in schema.COMPUTE_KEYS))


def check_finished_rerun(saved_config, config, directory: str) -> None:
  """Refuse to report a finished run as done for a config that would train another one (a
  changed opt.lr, say), naming the keys: "nothing to do" would silently drop the change.
  Keys the saved config lacks were added since (their defaults keep the old behaviour).
  train.steps may differ: a run stopped early was finished at its checkpoint's step, and a
  raised train.steps continues the run rather than reaching this check."""
  saved_keys = set(schema.flatten(saved_config.to_dict()))
  changed = [(k, a, b) for k, a, b in differences(
      saved_config, config,
      lambda k: k in saved_keys and k != "train.steps" and k not in BOOKKEEPING_KEYS)
             if not (k == "train.init_from" and a and b and os.path.normpath(a) ==
                     os.path.normpath(b))]
  if changed:
    raise ValueError(f"{directory} is a finished run of other settings ({describe(changed)}); "
                     f"use a new --workdir to train with them, or raise train.steps past "
                     f"{config.train.steps} to continue this run with them")


def restore(manager, step: int, abstract_state: dict) -> tuple[dict, dict]:
  """Restore (state, data_state) at `step` into the shardings of `abstract_state`."""
  rest = {k: v for k, v in abstract_state.items() if k != "params"}
  restored = manager.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract_state["params"]),
      train_state=ocp.args.StandardRestore(rest),
      data=ocp.args.JsonRestore()))
  state = dict(restored.train_state)
  state["params"] = restored.params
  return state, restored.data


def gather_host_states(local: dict[str, Any]) -> dict[str, Any]:
  """Union of every process's JSON-able data-shard states, available on all processes.

  Each host reads only its own data shards, but the checkpoint's JSON item is written by
  process 0, so the positions travel to it as padded byte arrays in one all-gather.
  """
  if jax.process_count() == 1:
    return dict(local)
  blob = np.frombuffer(json.dumps(local).encode(), dtype=np.uint8)
  sizes = multihost_utils.process_allgather(np.array([blob.size], np.int64))
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:blob.size] = blob
  blobs = multihost_utils.process_allgather(padded)
  merged: dict[str, Any] = {}
  for row, size in zip(np.asarray(blobs), np.asarray(sizes).reshape(-1)):
    merged.update(json.loads(row[:int(size)].tobytes().decode()))
  return merged


def load_for_inference(workdir: str, step: int | None = None):
  """(config, model_config, params, tokenizer) from a run's latest (or given) checkpoint.

  Parameters land on the default device, whatever mesh they were trained on. This reads
  nothing of the optimizer state, so it is cheap even for runs trained with Adam.
  """
  # Deferred: the model and data layers are heavy and only inference needs them here.
  from transformer import data
  from transformer.model import models
  from transformer.training import train_state
  manager = read_only_manager(workdir)
  step = readable_step(manager, step, workdir)
  config = read_config(manager, step)
  model = models.make_model(config.model)
  _, abstract = train_state.abstract_params(model, config)
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          abstract)
  params = manager.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract))).params
  manager.close()
  tokenizer = data.get_tokenizer(config.data, tokenizer_dir(workdir))
  return config, config.model, params, tokenizer


def tokenizer_dir(workdir: str) -> str:
  """Where a run keeps its tokenizer files, so inference finds the one it trained with."""
  return os.path.join(os.path.abspath(workdir), "tokenizer")

