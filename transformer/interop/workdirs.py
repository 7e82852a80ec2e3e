"""Run directories for converted models, laid out as the train command leaves them
(config.json, checkpoints/, tokenizer/), so transformer.generate and evaluation load a converted
model like a trained one; and the tokenizer that travels with an export.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
from flax.linen import meta

from transformer.interop.hf import _read_json, hf_config
from transformer.model import models
from transformer.training.workdir_cleanup import missing_folders, remove_empty


# The run config around a converted model: each kind's built-in objective and dataset, with
# the train/opt defaults of configs/lm.py, mlm.py and seq2seq.py (the library never imports
# configs/). Rows of 64 bytes hold every algorithmic/reverse example, as seq2seq.py computes.
RUN_DEFAULTS = {"decoder": ("lm", dict(name="grammar_corpus", seq_len=128)),
                "encoder": ("mlm", dict(name="grammar_corpus", seq_len=128)),
                "encoder_decoder": ("seq2seq", dict(name="algorithmic", task="reverse",
                                                    seq_len=64))}


def run_config(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A whole experiment config (data, objective, train, opt) for the model config `cfg`."""
  from transformer import data, schema
  objective, data_overrides = RUN_DEFAULTS[cfg.kind]
  data_config = data.default_config()
  data_config.update(data_overrides)
  config = schema.experiment_config(cfg, data_config, schema.objective_config(objective),
                                    steps=600, batch_size=32 if objective == "seq2seq" else 16,
                                    log_every=25, eval_every=200, checkpoint_every=200)
  config.opt.warmup_steps = 50
  return config
HF_TOKENIZER = "huggingface"  # data.tokenizer of a converted run; its files go to tokenizer/
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "vocab.txt", "spiece.model", "tokenizer.model",
                   "generation_config.json")


# A run trained on the built-in bytes tokenizer has no file transformers reads: the export
# names it (and its special ids) in config.json, so importing the export back restores it.
TOKENIZER_KEY = "transformer_tokenizer"
BUILTIN_TOKENIZERS = ("bytes",)


def export_tokenizer(workdir: str, dst: str, kind: str) -> str:
  """Put a run's tokenizer beside its exported model; returns what was done, for the log."""
  from transformer.training import checkpoint
  from transformer.data import external_tokenizers, tokenizers
  path = os.path.join(workdir, "config.json")
  name = _read_json(path).get("data", {}).get("tokenizer") if os.path.exists(path) else None
  if name == HF_TOKENIZER:
    source = checkpoint.tokenizer_dir(workdir)
    found = [n for n in TOKENIZER_FILES if os.path.exists(os.path.join(source, n))]
    kept = [n for n in found if os.path.exists(os.path.join(dst, n))]  # the user's: not replaced
    copied = [n for n in found if n not in kept]
    for n in copied:
      shutil.copyfile(os.path.join(source, n), os.path.join(dst, n))
    done = (f"tokenizer files {', '.join(copied) or '(none found)'} copied"
            + (f"; {', '.join(kept)} already in {dst}, kept (the run's are in {source})"
               if kept else ""))
    if "tokenizer.json" not in found or not os.path.exists(os.path.join(dst, "config.json")):
      return done
    # The ids the run trained with (its special_ids.json, else the tokenizer's own tokens),
    # not the exporter's defaults: transformers would take GPT-2's 50256, T5's eos=1.
    try:
      tok = external_tokenizers.HuggingFaceTokenizer(source)
    except ValueError as e:
      return done + f"; its special ids not recorded ({e})"
    _record_special_ids(dst, kind, {}, tok.pad_id, tok.bos_id, tok.eos_id)
    return done + "; its special ids recorded in config.json"
  if name in BUILTIN_TOKENIZERS:
    _record_special_ids(dst, kind, {TOKENIZER_KEY: name}, tokenizers.PAD_ID,
                        tokenizers.BOS_ID, tokenizers.EOS_ID)
    return f"the {name} tokenizer and its special ids recorded in config.json"
  return f"data.tokenizer={name!r} is not exported: ship its files with the model yourself"


def _record_special_ids(dst: str, kind: str, extra: dict, pad: int, bos: int, eos: int):
  hf = _read_json(os.path.join(dst, "config.json"))
  hf.update(extra, pad_token_id=pad, bos_token_id=bos, eos_token_id=eos)
  if kind == "encoder_decoder":  # our decoders start from BOS
    hf["decoder_start_token_id"] = bos
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)


def special_ids(hf_config: dict, kind: str) -> dict:
  """The model's own special ids, for transformer.data's 'huggingface' tokenizer. An
  encoder-decoder's decoder starts from decoder_start_token_id (T5: the pad id)."""
  first = lambda v: v[0] if isinstance(v, list) else v
  bos = hf_config.get("bos_token_id")
  if kind == "encoder_decoder":
    bos = hf_config.get("decoder_start_token_id", bos)
  return {"pad": first(hf_config.get("pad_token_id")), "bos": first(bos),
          "eos": first(hf_config.get("eos_token_id"))}


def _check_special_ids(ids: dict, tokenizer_dir: str) -> None:
  """Refuse, before writing anything, special ids the checkpoint's tokenizer.json lacks (a
  config left at GPT2Config's 50256 beside a small tokenizer): training would fail later."""
  path = os.path.join(tokenizer_dir, "tokenizer.json")
  if not os.path.exists(path):
    return
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top  # the hf extra
  except ImportError:  # without it the tokenizer cannot be read anyway; training says so
    return
  try:
    size = tokenizers.Tokenizer.from_file(path).get_vocab_size()
  except Exception:  # pylint: disable=broad-except  # tokenizers raises a bare Exception
    return  # unreadable here: the weights still convert, and training names the file's error
  from transformer.data import external_tokenizers  # deferred, as the module's other data imports
  outside = external_tokenizers.out_of_range(ids, size)
  if outside:
    raise ValueError(f"{tokenizer_dir}/config.json names special ids {outside} outside its "
                     f"tokenizer.json's {size} tokens; correct them there (nothing was written)")


def check_new_workdir(workdir: str) -> None:
  """Refuse a run directory that exists and is not empty. Saving step 0 with keep=1 would
  prune a training run's checkpoints, its config.json would be overwritten and its
  metrics.jsonl left beside a different model; a HF directory would lose its config.json."""
  if os.path.exists(workdir) and not (os.path.isdir(workdir) and not os.listdir(workdir)):
    raise FileExistsError(f"{workdir} already exists and is not empty; convert into a new "
                          f"directory (nothing was written)")


def save_workdir(cfg, variables, workdir: str, tokenizer_dir: str | None = None) -> str:
  """Write a run directory holding these parameters as the checkpoint of step 0 (with the
  source's tokenizer files and special ids when `tokenizer_dir` is a HF directory).
  `workdir` must not exist or be empty. Returns a line on the tokenizer, for the log.

  Everything is written into a sibling folder renamed into place at the end, so an
  interrupted conversion leaves no half-written `workdir` for the retry to refuse."""
  check_new_workdir(workdir)
  final = os.path.abspath(workdir)
  made = missing_folders(os.path.dirname(final))  # removed again if the conversion fails
  os.makedirs(os.path.dirname(final), exist_ok=True)
  workdir = f"{final}.partial.{os.getpid()}"
  shutil.rmtree(workdir, ignore_errors=True)
  try:
    note = _write_workdir(cfg, variables, workdir, tokenizer_dir, final)
    os.replace(workdir, final)  # onto a missing or empty directory
  except BaseException:
    shutil.rmtree(workdir, ignore_errors=True)
    remove_empty(made)
    raise
  return note


def _write_workdir(cfg, variables, workdir: str, tokenizer_dir: str | None, final: str) -> str:
  from transformer.training import checkpoint  # deferred: orbax is only needed here
  config = run_config(cfg)
  hf = _read_json(os.path.join(tokenizer_dir, "config.json")) if tokenizer_dir else {}
  has_files = tokenizer_dir and any(os.path.exists(os.path.join(tokenizer_dir, n))
                                    for n in TOKENIZER_FILES)
  config.data.tokenizer = (hf[TOKENIZER_KEY] if hf.get(TOKENIZER_KEY) in BUILTIN_TOKENIZERS
                           and not has_files else HF_TOKENIZER)
  config.data.seq_len = min(config.data.seq_len, cfg.max_len)  # init traces this length
  if tokenizer_dir and config.data.tokenizer == HF_TOKENIZER:
    ids = special_ids(hf, cfg.kind)
    _check_special_ids(ids, tokenizer_dir)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json(indent=2, sort_keys=True) + "\n")
  out = checkpoint.tokenizer_dir(workdir)
  copied = []
  if tokenizer_dir and config.data.tokenizer == HF_TOKENIZER:
    os.makedirs(out, exist_ok=True)
    for name in TOKENIZER_FILES:
      if os.path.exists(os.path.join(tokenizer_dir, name)):
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(out, name))
        copied.append(name)
    with open(os.path.join(out, "special_ids.json"), "w") as f:
      json.dump(ids, f)
  if config.data.tokenizer != HF_TOKENIZER:
    note = f"tokenizer: the built-in {config.data.tokenizer!r}, recorded in config.json"
  elif "tokenizer.json" in copied:
    note = f"tokenizer files {', '.join(copied)} copied"
  else:
    # A model-only checkpoint (or one with only slow-tokenizer files, which the tokenizers
    # package cannot read): say now what generate and fine-tuning will ask for.
    note = (f"no tokenizer.json in {tokenizer_dir or 'the source'}"
            + (f" (copied {', '.join(copied)})" if copied else "")
            + f": put the model's tokenizer.json in {checkpoint.tokenizer_dir(final)}/ before "
            f"generating (transformers' "
            f"AutoTokenizer save_pretrained writes one), or fine-tune with another "
            f"--config.data.tokenizer")
  manager = checkpoint.make_manager(workdir, keep=1, keep_best=0, async_save=False)
  params = meta.unbox(variables["params"])
  state = {"params": params, "step": jnp.zeros((), jnp.int32)}
  checkpoint.save(manager, 0, state, {}, config, force=True)
  checkpoint.close(manager)  # with its sha256 record, as a trained run's steps have
  return note


def load_workdir(workdir: str, step: int | None = None, for_hf: bool = False):
  """(model_config, variables) of a run directory's latest (or given) checkpoint. With
  `for_hf`, a model no Hugging Face family writes exactly is refused before any parameter
  is read."""
  from transformer.training import checkpoint
  import orbax.checkpoint as ocp
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise FileNotFoundError(f"{workdir}/checkpoints not found; give a run directory written by "
                            f"transformer.train or --from_hf")
  manager = checkpoint.read_only_manager(workdir)
  try:
    step = checkpoint.readable_step(manager, step, workdir)
    cfg = checkpoint.read_config(manager, step).model
    if for_hf:
      hf_config(cfg)
    model = models.make_model(cfg)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), *models.dummy_inputs(cfg)))
    params = manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(meta.unbox(abstract)["params"]))).params
  finally:
    manager.close()
  return cfg, {"params": params}

