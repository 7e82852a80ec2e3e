r"""Hugging Face checkpoints <-> this project's model config and parameters.

    python -m transformer.convert --from_hf SRC_DIR --to WORKDIR   # HF directory -> a run dir
    python -m transformer.convert --from WORKDIR --to_hf DST_DIR   # and back
(the command is transformer/convert.py; this module is the library.)

Nothing saved is overwritten: --to must be new or empty (writing step 0 into a training run
would prune its checkpoints), and --to_hf must hold no config.json, safetensors or checkpoints/.

    model_config, variables = hf.from_hf("gpt2_dir")
    logits_BLV = models.make_model(model_config).apply(variables, tokens_BL)
    hf.to_hf(model_config, variables, "out_dir")

GPT-2, Llama, BERT and T5, picked by config.json's model_type; their names, layouts and
configs are in transformer/interop/hf_families.py. Every parameter of ours must come from a tensor and
every tensor must be used or be a known duplicate/buffer, so nothing is left at random init or
dropped unnoticed. Export re-reads the config it writes and refuses a model the family cannot
express exactly. Only safetensors and numpy are used: converting needs no PyTorch.
"""

import contextlib
import json
import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util
from flax.linen import meta
import safetensors
from safetensors.numpy import save_file

from transformer import schema
from transformer.model import models
from transformer.interop.hf_families import FAMILIES, family_of

# Keys that choose how a model is computed or trained, not which function it is: free to
# override on import, and ignored when checking that an export is exact.
RUNTIME_KEYS = schema.RUNTIME_KEYS
# The position keys each scheme (and each RoPE scaling) reads; the rest do not change the model.
POSITION_KEYS = {"learned": (), "t5_bias": ("num_buckets", "max_distance"),
                 "rope": ("theta", "rotary_fraction", "scaling")}
ROPE_SCALING_KEYS = {"none": (), "linear": ("scaling_factor",),
                     "llama3": ("scaling_factor", "original_max_len", "low_freq_factor",
                                "high_freq_factor"),
                     "yarn": ("scaling_factor", "original_max_len", "beta_fast", "beta_slow")}


# ---------------------------------------------------------------------------------------------
# Reading and writing Hugging Face directories.

INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"


def _read_json(path):
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    raise FileNotFoundError(f"{path} not found; a Hugging Face checkpoint directory holds "
                            f"config.json and model.safetensors") from None


def _family(hf: dict, path: str):
  model_type = hf.get("model_type")
  if model_type not in FAMILIES:
    raise ValueError(f"{path}/config.json has model_type {model_type!r}; convertible: "
                     f"{sorted(FAMILIES)}")
  return FAMILIES[model_type]


@contextlib.contextmanager
def safe_open(path: str, framework: str):
  """safetensors.safe_open, its errors on a damaged file one line that names it."""
  try:
    opened = safetensors.safe_open(path, framework)  # a damaged header fails here
  except safetensors.SafetensorError as e:
    raise ValueError(f"{path} is not a readable safetensors file "
                     f"({str(e).splitlines()[0][:160]}); copy it again") from None
  with opened as f:
    yield f


class Checkpoint:
  """The tensors of a directory (model.safetensors, or shards listed by an index), read on
  demand. Names are made canonical: a base-model checkpoint (GPT2Model, original `gpt2`)
  lacks the prefix the LM-head class puts on its names."""

  def __init__(self, path: str, family):
    self.path, self.family = path, family
    if os.path.exists(os.path.join(path, INDEX)):
      weight_map = _read_json(os.path.join(path, INDEX))["weight_map"]
    elif os.path.exists(os.path.join(path, SINGLE)):
      with safe_open(os.path.join(path, SINGLE), "np") as f:
        weight_map = {k: SINGLE for k in f.keys()}
    else:
      raise FileNotFoundError(f"{path} has neither {SINGLE} nor {INDEX} (for a "
                              f"pytorch_model.bin, re-save it with transformers first)")
    self.files = {self._canonical(k): (file, k) for k, file in weight_map.items()}

  def _canonical(self, name):
    f = self.family
    return name if name.startswith((f.prefix, *f.heads)) else f.prefix + name

  @property
  def names(self):
    return set(self.files)

  def get(self, name: str, needed_for: str = "") -> np.ndarray:
    if name not in self.files:
      raise ValueError(f"{self.path}: tensor {name!r} is missing"
                       + (f" (it holds {needed_for})" if needed_for else ""))
    file, key = self.files[name]
    with safe_open(os.path.join(self.path, file), "np") as f:
      if f.get_slice(key).get_dtype() != "BF16":
        return f.get_tensor(key)
    # numpy has no bfloat16; the flax reader does, through ml_dtypes. Keep it off accelerators.
    with jax.default_device(jax.devices("cpu")[0]), \
        safe_open(os.path.join(self.path, file), "flax") as f:
      return np.asarray(f.get_tensor(key))

  def same(self, a: str, b: str) -> bool:
    return b in self.files and np.array_equal(self.get(a), self.get(b))

  def check_unused(self, used: set, mirrors: dict) -> None:
    """Every tensor is used, a known buffer, a mirror, or an exact copy of one that is used."""
    fam = self.family
    for name in sorted(self.names - used):
      if name in mirrors or any(re.search(p, name) for p in fam.ignored):
        continue
      if name in fam.duplicates:
        if self.same(name, fam.duplicates[name]):
          continue
        raise ValueError(f"{self.path}: tensor {name!r} differs from {fam.duplicates[name]!r}, "
                         f"of which {fam.model_type} keeps one copy")
      raise ValueError(f"{self.path}: tensor {name!r} is not part of the {fam.model_type} "
                       f"model we build (another architecture or head?)")


def _mirrors(family, cfg) -> dict:
  """Tensors transformers keeps beside a rule's own for this config (see Bert.mirrors)."""
  return family.mirrors(cfg) if hasattr(family, "mirrors") else {}


def check_new_hf_dir(path: str) -> None:
  """Refuse to export into a directory that holds a model or a run: config.json and the
  tensors would be overwritten, and a stale model.safetensors next to a new sharded index (or
  shards next to a new single file) would be the one transformers loads. Other files, say a
  tokenizer put there first, are no obstacle."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise FileExistsError(f"{path} is a file; export to a new directory")
  held = sorted(n for n in (os.listdir(path) if os.path.isdir(path) else ())
                if n in ("config.json", "checkpoints") or n.endswith(".safetensors")
                or n.startswith(SINGLE))
  if held:
    raise FileExistsError(f"{path} already holds {', '.join(held)}; export to a new directory "
                          f"(nothing was written)")


def _write_tensors(tensors: dict, path: str, max_shard_bytes: int) -> None:
  metadata = {"format": "pt"}  # transformers refuses safetensors files without it
  total = sum(t.nbytes for t in tensors.values())
  if total <= max_shard_bytes:
    save_file(tensors, os.path.join(path, SINGLE), metadata=metadata)
    return
  shards, size = [{}], 0
  for name, t in tensors.items():
    if shards[-1] and size + t.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = t
    size += t.nbytes
  weight_map = {}
  for i, shard in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(path, file), metadata=metadata)
    weight_map.update({name: file for name in shard})
  with open(os.path.join(path, INDEX), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ---------------------------------------------------------------------------------------------
# Parameters: flat "a/b/c" paths, layers unrolled; nn.scan's stacked layers are converted.

def _param_shapes(cfg) -> dict:
  cfg = ml_collections.ConfigDict(cfg.to_dict())
  cfg.scan_layers = False
  model = models.make_model(cfg)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), *models.dummy_inputs(cfg)))
  return traverse_util.flatten_dict(meta.unbox(shapes)["params"], sep="/")


def _scan(tree):
  """layers_0 .. layers_{n-1} -> one 'layers' subtree stacked on a leading axis (nn.scan)."""
  if not isinstance(tree, dict):
    return tree
  tree = {k: _scan(v) for k, v in tree.items()}
  if "layers_0" in tree:
    n = sum(k.startswith("layers_") for k in tree)
    tree["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs),
                                  *[tree.pop(f"layers_{i}") for i in range(n)])
  return tree


def _unscan(tree):
  if not isinstance(tree, dict):
    return tree
  tree = {k: _unscan(v) for k, v in tree.items()}
  if "layers" in tree:
    stacked = tree.pop("layers")
    n = jax.tree.leaves(stacked)[0].shape[0]
    tree.update({f"layers_{i}": jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n)})
  return tree


def _arch(cfg) -> dict:
  """The keys that decide what a model computes, with 0-means-default values resolved."""
  c = cfg.to_dict()
  for key in RUNTIME_KEYS:
    c.pop(key)
  c["attention"] = schema.attention_function(cfg)  # softmax, or an approximation of it
  c["num_kv_heads"], c["head_dim"] = models.num_kv_heads(cfg), models.head_dim(cfg)
  if cfg.kind == "encoder_decoder":
    c["num_encoder_layers"] = cfg.num_encoder_layers or cfg.num_layers
    c["num_decoder_layers"] = cfg.num_decoder_layers or cfg.num_layers
    del c["num_layers"]
  else:
    del c["num_encoder_layers"], c["num_decoder_layers"]
  if cfg.kind != "encoder":
    del c["pooler"]
  pos = cfg.position
  keys = POSITION_KEYS.get(pos.name, tuple(pos))
  keys += ROPE_SCALING_KEYS.get(pos.scaling, ()) if pos.name == "rope" else ()
  c["position"] = {k: pos[k] for k in ("name",) + keys}
  if "original_max_len" in keys:
    c["position"]["original_max_len"] = pos.original_max_len or cfg.max_len
  if pos.name not in ("learned", "rope"):
    del c["max_len"]  # only a learned table and RoPE scalings read it
  return traverse_util.flatten_dict(c, sep=".")


def hf_config(cfg: ml_collections.ConfigDict) -> dict:
  """The config.json of a model config, checked to read back as the same model."""
  family = family_of(cfg)
  cannot = (f"this model cannot be written as a Hugging Face {family.model_type} checkpoint "
            f"(the family of a {cfg.kind} with {cfg.position.name} positions)")
  # What to do: the key is fixed at training time; configs/arch/ holds one model per family.
  fix = "train with --config.model.KEY=VALUE to match it, as configs/arch/ does"
  try:
    written = family.hf_config(cfg)
  except ValueError as e:
    raise ValueError(f"{cannot}: {e}; {fix}") from None
  hf = {"architectures": [family.architecture], "model_type": family.model_type,
        **written, "dtype": cfg.param_dtype}
  names = {r.hf for r in family.rules(cfg)}
  back = _arch(family.config(hf, names, lambda a, b: False))
  now = _arch(cfg)
  differ = [f"model.{k}={now[k]!r} would read back as {back.get(k)!r}"
            for k in now if now[k] != back.get(k)]
  if differ:
    raise ValueError(f"{cannot}: {', '.join(differ)}; {fix}")
  return hf


def from_hf(path: str, **overrides) -> tuple[ml_collections.ConfigDict, dict]:
  """(model_config, {"params": ...}) from a Hugging Face checkpoint directory.

  `overrides` set runtime keys of the model config (dtype, param_dtype, attention,
  scan_layers, remat, ...); parameters are cast to param_dtype (default float32)."""
  hf = _read_json(os.path.join(path, "config.json"))
  family = _family(hf, path)
  ckpt = Checkpoint(path, family)
  cfg = family.config(hf, ckpt.names, ckpt.same)
  for key, value in overrides.items():
    if key not in RUNTIME_KEYS:
      raise ValueError(f"from_hf can override only runtime keys {list(RUNTIME_KEYS)}, "
                       f"not {key!r} (the checkpoint decides the architecture)")
    cfg[key] = value
  expected = _param_shapes(cfg)
  dtype = jnp.dtype(cfg.param_dtype)
  flat, used = {}, set()
  mirrors = _mirrors(family, cfg)
  stand_ins = {hf: mirror for mirror, hf in mirrors.items() if mirror in ckpt.names}
  for rule in family.rules(cfg):
    name = rule.hf if rule.hf in ckpt.names else stand_ins.get(rule.hf, rule.hf)
    x = ckpt.get(name, needed_for=", ".join(rule.ours))
    want = [expected[p].shape for p in rule.ours]
    try:
      parts = rule.to_ours(x)
    except ValueError:
      parts = None
    if parts is None or [p.shape for p in parts] != want:
      raise ValueError(f"{path}: tensor {name!r} has shape {tuple(x.shape)}, which does not "
                       f"fit {', '.join(rule.ours)} of shape {', '.join(map(str, want))}")
    flat.update({p: jnp.asarray(a, dtype) for p, a in zip(rule.ours, parts)})
    used.add(name)
  unfilled = sorted(set(expected) - set(flat))
  if unfilled:
    raise ValueError(f"{path}: no {family.model_type} tensor fills parameter {unfilled[0]!r}")
  ckpt.check_unused(used, mirrors)
  params = traverse_util.unflatten_dict(flat, sep="/")
  return cfg, {"params": _scan(params) if cfg.scan_layers else params}


def to_hf(cfg: ml_collections.ConfigDict, variables: dict, path: str,
          max_shard_bytes: int = 5 * 10**9) -> None:
  """Write `path`/config.json and model.safetensors (or shards and an index) for transformers.
  `path` must be new, empty, or hold no config.json, safetensors or checkpoints/."""
  check_new_hf_dir(path)
  hf = hf_config(cfg)
  family = family_of(cfg)
  params = meta.unbox(variables.get("params", variables))
  params = _unscan(params) if cfg.scan_layers else params
  flat = traverse_util.flatten_dict(params, sep="/")
  tensors, used = {}, set()
  for rule in family.rules(cfg):
    for p in rule.ours:
      if p not in flat:
        raise ValueError(f"parameter {p!r} is missing (it makes tensor {rule.hf!r})")
    tensors[rule.hf] = np.ascontiguousarray(rule.to_hf(*(np.asarray(flat[p]) for p in rule.ours)))
    used.update(rule.ours)
  for mirror, source in _mirrors(family, cfg).items():
    tensors[mirror] = tensors[source]
  extra = sorted(set(flat) - used)
  if extra:
    raise ValueError(f"parameter {extra[0]!r} has no place in a {family.model_type} checkpoint")
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)
  _write_tensors(tensors, path, max_shard_bytes)
