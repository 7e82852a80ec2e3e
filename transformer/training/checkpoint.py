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
the folder and the space left, the last complete checkpoint untouched (`DiskFull`).
"""

import errno
import json
import logging
import os
import shutil
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers

from transformer import schema
from transformer.training import checkpoint_integrity


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


class _DiskFullNoiseFilter(logging.Filter):
  """Orbax's writer threads log each ENOSPC with its traceback; `DiskFull` says it once."""

  def filter(self, record):
    error = record.exc_info[1] if record.exc_info else None
    return _is_disk_full(record.getMessage()) is None and _is_disk_full(error) is None


class DiskFull(ValueError):
  """A save, or another write of the run, failed for lack of space: one line for the user."""


def _is_disk_full(error):
  """The ENOSPC/EDQUOT OSError anywhere in the chain, or the error with tensorstore's text
  for it; None if there is none."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
      return error
    text = str(error)
    if "No space left on device" in text or "os_error_code='28'" in text:
      return error
    if isinstance(error, str):
      return None
    error = error.__cause__ or error.__context__
  return None


def _free_bytes(path: str) -> int | None:
  while path and not os.path.exists(path):
    path = os.path.dirname(path)
  try:
    return shutil.disk_usage(path or ".").free
  except OSError:
    return None


def _size(n: float) -> str:
  for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
    n /= 1024


def free_space(path: str) -> str:
  """'12.3 MiB free' on the file system that holds `path` (or its nearest existing parent)."""
  free = _free_bytes(path)
  return "free space unknown" if free is None else f"{_size(free)} free"


def _check_space(manager, step: int, state: dict) -> None:
  """Refuse a save that cannot fit before writing a byte of it: an ENOSPC inside orbax's
  writer threads stops the run too, but amid their noise. The need is the last step's size on
  disk (orbax compresses), or the state's bytes for a first save."""
  directory = str(manager.directory)
  steps = checkpoint_integrity.step_dirs(directory)
  if steps:
    last = steps[max(steps)]
    need = sum(os.path.getsize(os.path.join(parent, name))
               for parent, _, names in os.walk(last) for name in names)
  else:
    need = sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))
  free = _free_bytes(directory)
  if free is not None and free < need:
    last = (f"the last complete checkpoint, step {max(steps)}, is intact" if steps else
            "no checkpoint was completed yet")
    raise DiskFull(f"no space left on the device of {directory} for the step-{step} "
                   f"checkpoint (about {_size(need)} needed, {_size(free)} free); {last}: free "
                   f"some space and re-run the same command to resume")


def disk_full(error, where: str) -> DiskFull | None:
  """The one-line DiskFull for `error` if it is one (None otherwise); `where`: what was written."""
  found = _is_disk_full(error)
  if found is None:
    return None
  path = getattr(found, "filename", None) or where
  return DiskFull(f"no space left on the device of {path} ({free_space(path)}): free some "
                  f"space and re-run the same command to resume")


def _remove_tree(path: str, tries: int = 5) -> None:
  """rmtree that retries while a straggling writer thread adds files behind it (each retry
  after 50 ms; the caller already waited for the writers it can name)."""
  for _ in range(tries):
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.exists(path):
      return
    time.sleep(0.05)


def _save_failed(error, manager) -> DiskFull | None:
  """A failed save as DiskFull, its partial temporary folder removed (it only takes space)."""
  if _is_disk_full(error) is None:
    return None
  # An async save's error surfaces before orbax has waited for its checkpoint-metadata
  # writer, which may still (re)write into the temporary folder: wait for it first, or the
  # folder removed below comes back.
  store = getattr(manager, "_non_blocking_metadata_store", None)
  if store is not None:
    try:
      store.wait_until_finished()
    except Exception:  # pylint: disable=broad-except
      pass  # its own failure is the same full disk
  directory = str(manager.directory)
  partial = [n for n in os.listdir(directory) if ".orbax-checkpoint-tmp" in n] \
      if os.path.isdir(directory) else []
  if jax.process_index() == 0:
    for name in partial:
      _remove_tree(os.path.join(directory, name))
  steps = sorted(checkpoint_integrity.step_dirs(directory))
  failed = ", ".join(sorted({n.split(".")[0] for n in partial})) or "?"
  last = (f"the last complete checkpoint, step {steps[-1]}, is intact" if steps else
          "no checkpoint was completed yet")
  return DiskFull(f"no space left on the device of {directory} saving the step-{failed} "
                  f"checkpoint ({free_space(directory)}); {last}: free some space and re-run "
                  f"the same command to resume")


def _filter_once(logger, cls) -> None:
  if not any(isinstance(f, cls) for f in logger.filters):
    logger.addFilter(cls())


def read_only_manager(workdir: str) -> ocp.CheckpointManager:
  """A manager that reads another run's checkpoints (train.init_from) and never writes."""
  logger = absl_logging.get_absl_logger()
  if not any(isinstance(f, _ReadOnlyNoiseFilter) for f in logger.filters):
    logger.addFilter(_ReadOnlyNoiseFilter())
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                               options=ocp.CheckpointManagerOptions(read_only=True))


def make_manager(workdir: str, keep: int = 3, keep_best: int = 1,
                 async_save: bool = True) -> ocp.CheckpointManager:
  """Keeps the last `keep` checkpoints plus the `keep_best` lowest eval losses."""
  logger = absl_logging.get_absl_logger()
  _filter_once(logger, _NoMetricsWarningFilter)
  _filter_once(logger, _DiskFullNoiseFilter)
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
         force: bool = False) -> bool:
  """Start an (async) save of the train state, data positions and config at `step`, once the
  previous save is complete and recorded (`finish`; orbax's save would wait for it anyway)."""
  finish(manager)
  _check_space(manager, step, state)
  metrics = None if eval_loss is None else {"eval_loss": float(eval_loss)}
  args = ocp.args.Composite(
      params=ocp.args.StandardSave(state["params"]),
      train_state=ocp.args.StandardSave(
          {k: v for k, v in state.items() if k != "params"}),
      data=ocp.args.JsonSave(data_state),
      meta=ocp.args.JsonSave({"config": json.loads(config.to_json())}))
  try:
    saved = manager.save(step, args=args, metrics=metrics, force=force)
  except Exception as e:  # pylint: disable=broad-except
    raise _save_failed(e, manager) or e
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
    raise _save_failed(e, manager) or e
  if jax.process_index() == 0:
    steps = checkpoint_integrity.step_dirs(str(manager.directory))
    for step in manager.all_steps():
      if step in steps:
        checkpoint_integrity.record(steps[step])


def check_saving(manager) -> None:
  """Per step: `finish` a background save as soon as it ended, so a failed one stops the run
  at once instead of at the next save, and the sums are recorded while the run goes on."""
  if id(manager) in _in_flight and not manager.is_saving_in_progress():
    finish(manager)


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
    damaged = checkpoint_integrity.set_aside_damaged(workdir, log)
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


def read_config(manager, step: int) -> ml_collections.ConfigDict:
  meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
  return ml_collections.ConfigDict(meta["config"])




def differences(saved_config, config, keys=None) -> list[tuple[str, Any, Any]]:
  """(key, saved, now) for the flat keys that differ; `keys` filters by name."""
  # JSON (the saved config) has no tuples: compare (-1, 1, 1) and [-1, 1, 1] as equal.
  saved, now = ({k: tuple(v) if isinstance(v, list) else v for k, v in flatten(c).items()}
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
  if model:
    raise ValueError(f"{directory} holds a checkpoint of a different model "
                     f"({describe(model)}); use a new --workdir or the saved config")
  saved_keys = set(flatten(saved_config.to_dict()))
  stream = differences(saved_config, config, lambda k: k in saved_keys and (
      k in schema.STREAM_KEYS or k.startswith("data.") and k not in schema.RELOCATABLE_DATA_KEYS))
  if stream:
    raise ValueError(f"{directory} holds a checkpoint of a different data stream "
                     f"({describe(stream)}); its data position would continue another "
                     f"experiment: use a new --workdir or the saved settings")


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
  manager = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                                  options=ocp.CheckpointManagerOptions(read_only=True))
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {workdir}/checkpoints")
  if step not in manager.all_steps():
    raise FileNotFoundError(f"no checkpoint of step {step} under {workdir}/checkpoints; "
                            f"saved steps: {sorted(manager.all_steps())}")
  damage = checkpoint_integrity.problem(os.path.join(str(manager.directory), str(step)))
  if damage is not None:
    raise ValueError(f"the step-{step} checkpoint in {manager.directory} is damaged ({damage}); "
                     f"pass --step with another of {sorted(manager.all_steps())}")
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


def flatten(d: dict, prefix: str = "") -> dict:
  """{"a": {"b": 1}} -> {"a.b": 1}: configs as flat key lists, for diffs and summaries."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out
