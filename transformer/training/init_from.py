"""`train.init_from=WORKDIR[:STEP]`: start a new run from another run's parameters only.

The source is a training run or a `transformer.convert --from_hf` directory (its parameters
are the checkpoint of step 0). What is taken: the parameters, restored straight into this
run's shardings (each host reads only its shards; orbax casts to this run's param_dtype),
and the tokenizer files when this run uses the same tokenizer. What is not: optimizer state,
step, RNG and data position, which start fresh. Before anything is computed the source's
model keys are compared with this run's; only `schema.RUNTIME_KEYS` may differ (compute
dtype, attention kernel, remat, dropout; param_dtype is a cast; scan_layers restores in the
source's layout and is restacked on the devices).

The train loop calls this only while the run has no checkpoint of its own: once it has one,
resuming resumes it and init_from is not read again.
"""

import dataclasses
import json
import os
import re
import shutil

import jax
import ml_collections
import orbax.checkpoint as ocp

from transformer import schema
from transformer.training import checkpoint, sharding, train_state


@dataclasses.dataclass(frozen=True)
class Source:
  spec: str      # as given: WORKDIR[:STEP]
  workdir: str
  step: int
  config: ml_collections.ConfigDict  # the full experiment config saved with that step

  @property
  def where(self) -> str:
    return f"{self.workdir} step {self.step}"


def parse(spec: str) -> tuple[str, int | None]:
  """"runs/a" -> ("runs/a", None); "runs/a:400" -> ("runs/a", 400)."""
  spec = os.path.expanduser(spec)  # "~/runs/a" given through --config (no shell expands it)
  match = re.fullmatch(r"(.*?):(\d+)", spec)
  return (match.group(1), int(match.group(2))) if match else (spec, None)


def check_workdir(config, workdir: str) -> None:
  """Refuse a train.init_from that is this run's own --workdir, before anything is written:
  the run would resume the source instead, pruning its checkpoints and replacing its
  summary.json. A source nested with the workdir (either way) is refused too: the run would
  write among the source's files (a step-named folder under its checkpoints/ reads as one of
  its steps), or the source among the run's, which its cleanup and records walk as its own."""
  if not config.train.init_from:
    return
  source = os.path.realpath(parse(config.train.init_from)[0])
  target = os.path.realpath(workdir)
  common = os.path.commonpath([source, target])
  if source == target:
    raise ValueError(f"train.init_from={config.train.init_from} is this run's --workdir "
                     f"{workdir}: training there would resume it and replace its checkpoints, "
                     f"not fine-tune it; pick a new --workdir (nothing was written)")
  if common in (source, target):  # nested: the run's files would mix with the source's
    where = "lies inside" if common == target else "holds"
    raise ValueError(f"train.init_from={config.train.init_from} {where} this run's --workdir "
                     f"{workdir}; pick a new --workdir beside it, not nested with it (nothing "
                     f"was written)")


def read_run_config(workdir: str, what: str) -> dict:
  """WORKDIR/config.json, as the train or convert command wrote it; one line for a Hugging
  Face checkpoint's config.json (which the convert command reads, not this), a corrupt file
  or another JSON. `what` names the flag or argument that gave `workdir`."""
  path = os.path.join(workdir, "config.json")
  try:
    with open(path) as f:
      saved = json.load(f)
  except json.JSONDecodeError as e:  # its own error type cannot be re-raised with a message
    raise ValueError(f"{what}: {path} is not valid JSON ({e.msg}: line {e.lineno} column "
                     f"{e.colno}); restore it from the run's records or a copy") from None
  except UnicodeDecodeError:
    raise ValueError(f"{what}: {path} is not UTF-8 text; restore it from the run's records "
                     f"or a copy") from None
  if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
    return saved
  if isinstance(saved, dict) and "model_type" in saved:
    raise ValueError(f"{what}: {workdir} is a Hugging Face checkpoint (model_type "
                     f"{saved['model_type']!r}), not a run directory; convert it first: python "
                     f"-m transformer.convert --from_hf {workdir} --to WORKDIR, then use WORKDIR")
  raise ValueError(f"{what}: {path} has no 'model' block, so it is not a run's config; give a "
                   f"directory the train or convert command wrote")


def check_own_config(workdir: str) -> None:
  """Refuse a --workdir whose config.json is not a run's (a Hugging Face checkpoint's, say),
  before anything is written: the run would move that file to config.1.json (run_log.py),
  so the folder would no longer load in transformers, and mix its own files in. A config.json
  that does not parse is left to the run (a run's own, cut short by a crash, is rewritten)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return
  if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
    return
  what = (f"a Hugging Face checkpoint (model_type {saved['model_type']!r})"
          if isinstance(saved, dict) and "model_type" in saved else "not a run directory")
  raise ValueError(f"--workdir {workdir} is {what}: its config.json is not a run's and "
                   f"training would move it aside; pick a new --workdir (to fine-tune a "
                   f"Hugging Face checkpoint, convert it with python -m transformer.convert "
                   f"--from_hf and set train.init_from to the converted directory)")


def open_source(config) -> Source:
  """The source named by config.train.init_from, checked against `config`: one-line errors
  for a path without checkpoints, a missing or damaged step, or a different model."""
  spec = config.train.init_from
  workdir, step = parse(spec)
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  hint = "give a run directory written by transformer.train or transformer.convert --from_hf"
  if not os.path.isdir(directory):
    if os.path.isfile(os.path.join(workdir, "config.json")):
      read_run_config(workdir, f"train.init_from={spec}")  # a HF checkpoint: say to convert
    raise FileNotFoundError(f"train.init_from={spec}: {directory} not found; {hint}")
  manager = checkpoint.read_only_manager(workdir)
  try:
    try:  # a missing step names the saved ones; a damaged one is refused, not fine-tuned from
      step = checkpoint.readable_step(manager, step, workdir,
                                      choose=f"set train.init_from={workdir}:STEP")
    except (FileNotFoundError, ValueError) as e:
      raise type(e)(f"train.init_from={spec}: {e}"
                    + (f"; {hint}" if not manager.all_steps() else "")) from None
    saved = checkpoint.read_config(manager, step)
  finally:
    manager.close()
  check_model(saved, config, spec, workdir)
  return Source(spec, workdir, step, saved)


def check_model(saved, config, spec: str, workdir: str) -> None:
  diffs = checkpoint.differences(saved, config, lambda k: k.startswith("model.") and
                                 k.split(".", 1)[1] not in schema.RUNTIME_KEYS)
  if diffs:
    shown = ", ".join(f"{k}: {a!r} there vs {b!r} here" for k, a, b in diffs[:4])
    raise ValueError(
        f"train.init_from={spec} holds a different model: {', '.join(k for k, _, _ in diffs)}"
        f" differ ({shown}{', ...' if len(diffs) > 4 else ''}); set them as the source has "
        f"them (configs/finetune.py:from={workdir} starts from its config); only "
        f"{', '.join(schema.RUNTIME_KEYS)} may differ")


def carry_tokenizer(source: Source, config, workdir: str) -> str:
  """Copy the source's tokenizer files into this run's tokenizer/ (files this run already
  has are kept), so the run is self-contained; returns a line for the log. A run that sets
  another data.tokenizer keeps its own."""
  theirs, ours = source.config.data.tokenizer, config.data.tokenizer
  if theirs != ours:
    return (f"tokenizer: this run's data.tokenizer={ours!r}, not the source's {theirs!r} "
            f"(the source's parameters were trained with the other one's ids)")
  src_dir = checkpoint.tokenizer_dir(source.workdir)
  dst_dir = checkpoint.tokenizer_dir(workdir)
  if not os.path.isdir(src_dir) or not os.listdir(src_dir):
    return f"tokenizer: {ours!r} (nothing to copy from {source.workdir})"
  copied = []
  for name in sorted(os.listdir(src_dir)):
    if os.path.isfile(os.path.join(src_dir, name)):
      if _copy_new(os.path.join(src_dir, name), os.path.join(dst_dir, name)):
        copied.append(name)
  if ours == "sentencepiece":
    # The model's file name hashes the data config: under this run's data it would be
    # trained anew. Put the source's model where this run looks for it.
    from transformer.data import tokenizers
    theirs_path = tokenizers.sentencepiece_path(source.config.data, src_dir)
    ours_path = tokenizers.sentencepiece_path(config.data, dst_dir)
    if os.path.exists(theirs_path) and _copy_new(theirs_path, ours_path):
      copied.append(os.path.basename(ours_path))
  return (f"tokenizer: {ours!r} from {src_dir} "
          f"({', '.join(copied) if copied else 'this run already had its files'})")


def _copy_new(src: str, dst: str) -> bool:
  """Copy unless `dst` exists; atomic (every host may copy into a shared workdir)."""
  if os.path.exists(dst):
    return False
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  tmp = f"{dst}.tmp.{os.getpid()}"
  shutil.copyfile(src, tmp)
  os.replace(tmp, dst)
  return True


def restore_params(source: Source, config, built, mesh):
  """The source's parameters in this run's shardings and param_dtype."""
  target = built.abstract_state["params"]
  same_layout = bool(source.config.model.scan_layers) == bool(config.model.scan_layers)
  if same_layout:
    abstract = target
  else:  # restore as saved (stacked or per layer), sharded on this mesh, then restack
    from transformer.model import models
    cfg = ml_collections.ConfigDict(config.model.to_dict())
    cfg.scan_layers = source.config.model.scan_layers
    full = ml_collections.ConfigDict(config.to_dict())
    full.model = cfg
    names, shapes = train_state.abstract_params(models.make_model(cfg), full)
    shards = sharding.param_shardings(names, shapes, mesh)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            shapes, shards)
  manager = checkpoint.read_only_manager(source.workdir)
  try:
    params = manager.restore(source.step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract))).params
  except (ValueError, KeyError, TypeError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f"train.init_from={source.spec}: its parameters do not restore into "
                     f"this model ({first})") from None
  finally:
    manager.close()
  # Orbax restores into the abstract target's dtype; a layout change (scan_layers) is one jit
  # away, whose astype also covers an orbax that would return the saved dtype.
  if same_layout and all(p.dtype == t.dtype for p, t in zip(jax.tree.leaves(params),
                                                            jax.tree.leaves(target))):
    return params
  def to_target(tree):
    if not same_layout:
      from transformer.interop import hf  # pylint: disable=import-outside-toplevel
      tree = (hf._scan if config.model.scan_layers else hf._unscan)(tree)  # pylint: disable=protected-access
    return jax.tree.map(lambda x, t: x.astype(t.dtype), tree, target)
  # No donation: the outputs differ in shape or dtype, so XLA could reuse no input buffer.
  return jax.jit(to_target, out_shardings=built.state_shardings["params"])(params)
