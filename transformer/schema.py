"""The config schema: model, train, opt and objective blocks with one default per key, size
presets, "k=v" config-file arguments, and the key lists that say which changes a checkpoint
survives (the checkpoint and conversion code both read them).

A config file (configs/) is the record of an experiment. Each family file (lm.py, mlm.py,
seq2seq.py, ...) builds on `model_config()` here, so every model key has exactly one default and
one meaning. Values are numbers and strings only (ml_collections can then override any of them
from the command line); "none"/0 stand for "off" instead of None.
"""

import ml_collections

# Model keys that choose *how* the same function is computed, not *what* it is: changing them
# on resume is allowed (e.g. switch attention kernels or add remat to fit a bigger batch), as
# long as attention_function (below) stays the same.
COMPUTE_KEYS = ("attention", "attention_chunk", "attention_query_block", "remat", "cache_dtype")
# Those, plus the keys of storage (dtypes, the scanned layout) and training-only noise: free to
# override when importing a checkpoint, and ignored when checking that an export is exact.
RUNTIME_KEYS = COMPUTE_KEYS + ("dtype", "param_dtype", "scan_layers", "dropout_rate",
                               "attention_dropout_rate")
# Attention "implementations" that compute another function than softmax attention
# (model/attention/approximate.py). Starting one from a softmax model's weights is allowed
# (train.init_from, convert --from_hf), but resuming a run with another function, or
# exporting one as a softmax model, is refused: attention_function tells them apart.
APPROXIMATE_ATTENTION = ("linear", "block_sparse")


def attention_function(model: ml_collections.ConfigDict) -> str:
  """What a model config's attention computes: "softmax" for every exact implementation."""
  if model.attention == "block_sparse":  # its blocks are attention_chunk long
    return f"block_sparse with attention_chunk={model.attention_chunk}"
  return model.attention if model.attention in APPROXIMATE_ATTENTION else "softmax"


# What a checkpoint's data positions index into: the same positions in another stream
# (other data, tokenizer, row layout, batch or shuffle) would resume some other experiment.
# Every data.* key counts except where the data lives.
STREAM_KEYS = ("train.batch_size", "train.seed", "train.data_shards", "train.train_split",
               "objective.name")
RELOCATABLE_DATA_KEYS = ("data.data_dir",)


def position_config(name: str = "rope", **overrides) -> ml_collections.ConfigDict:
  """Positional scheme: `name` picks the scheme, the other keys are its parameters.

  Every scheme reads only the keys it needs, so switching schemes on the command line
  (`--config.model.position.name=alibi`) needs no other edits.
  """
  cfg = ml_collections.ConfigDict(dict(
      name=name,
      # rope
      theta=10_000.0,
      rotary_fraction=1.0,  # partial rotary: the share of head_dim that is rotated (GPT-NeoX 0.25)
      scaling="none",  # none | linear | ntk | yarn | llama3 (context extension)
      scaling_factor=1.0,
      original_max_len=0,  # training length the scaling extends from (0: model.max_len)
      low_freq_factor=1.0,  # llama3
      high_freq_factor=4.0,  # llama3
      beta_fast=32.0,  # yarn
      beta_slow=1.0,  # yarn
      # t5_bias
      num_buckets=32,
      max_distance=128,
      # sinusoidal
      max_wavelength=10_000.0,
  ))
  cfg.update(overrides)
  return cfg


def model_config(**overrides) -> ml_collections.ConfigDict:
  """The model schema. Every module reads its settings from here and nothing else."""
  cfg = ml_collections.ConfigDict(dict(
      kind="decoder",  # decoder | encoder | encoder_decoder
      vocab_size=260,
      d_model=256,
      num_layers=4,  # decoder / encoder depth
      num_encoder_layers=0,  # encoder_decoder only; 0 means num_layers
      num_decoder_layers=0,  # encoder_decoder only; 0 means num_layers
      num_heads=4,
      num_kv_heads=0,  # 0 means num_heads (MHA); a divisor gives GQA; 1 is MQA
      head_dim=0,  # 0 means d_model // num_heads
      d_ff=1024,
      ffn="gelu",  # relu | gelu | gelu_tanh | swiglu | geglu
      norm="rmsnorm",  # rmsnorm | layernorm
      norm_eps=1e-6,
      norm_position="pre",  # pre | post (post is the original 2017 block)
      use_bias=False,
      position=position_config("rope"),
      # dense | chunked | query_blocks | fused_cpu | cudnn | splash | pallas_gpu | linear |
      # block_sparse | auto (AUTO_TABLE in transformer/model/attention/__init__.py)
      attention="auto",
      attention_chunk=512,  # query/key block size for chunked and block_sparse
      attention_query_block=64,  # queries per block for query_blocks (auto's CPU fallback); >= L/16
      window=0,  # sliding-window size; 0 means unlimited
      qk_scale=0.0,  # multiplies q.k; 0 means 1/sqrt(head_dim) (T5 folds it into init: 1.0)
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      tie_embeddings=True,
      scale_embeddings=False,  # multiply token embeddings by sqrt(d_model) (Vaswani et al.)
      scale_tied_logits=False,  # multiply the final state by d_model**-0.5 before a tied head (T5)
      embed_norm=False,  # a norm right after the embeddings (BERT)
      num_token_types=0,  # segment-A/B embeddings (BERT uses 2)
      pooler=False,  # encoder: a tanh-dense pooled output of the first token (BERT)
      mlm_transform=False,  # encoder: dense+act+norm before the MLM head (BERT)
      head_bias=False,  # a bias on the output vocabulary projection (BERT)
      dtype="float32",  # compute dtype; softmax and norms always run in float32
      param_dtype="float32",
      # decoding's KV cache: "" stores keys/values in dtype; bfloat16 halves the cache's memory
      # and what each step reads, rounding each key and value once (docs/design.md#generation)
      cache_dtype="",
      max_len=2048,
      scan_layers=False,
      remat="none",  # none | full | dots (save matmul outputs, recompute the rest)
  ))
  cfg.update(overrides)
  return cfg


# ---------------------------------------------------------------------------------------------
# Size presets and the rest of an experiment config (training, optimizer, mesh). Families
# (lm.py, mlm.py, seq2seq.py) combine these with a model kind, a dataset and an objective.

# Model sizes picked by `:size=NAME`. xs trains in seconds (tests), s in minutes on a laptop
# CPU; m and l are the training benchmark's W1 and W2 shapes.
SIZES = {
    "xs": dict(d_model=64, num_layers=2, num_heads=2, d_ff=256),
    "s": dict(d_model=128, num_layers=4, num_heads=4, d_ff=512),
    "m": dict(d_model=256, num_layers=4, num_heads=4, d_ff=1024),
    "l": dict(d_model=512, num_layers=8, num_heads=8, d_ff=2048),
    "xl": dict(d_model=1024, num_layers=16, num_heads=16, d_ff=4096),
}


def parse_args(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parse a config file's "key=value,key=value" argument against typed defaults.

  Values take the type of their default, so `size=xs,steps=100` gives a str and an int; a key
  without a default is an error listing the valid keys.
  """
  args = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or key not in defaults:
      raise ValueError(f"bad config argument {item!r}; expected key=value with key in "
                       f"{sorted(defaults)}")
    kind = type(defaults[key])
    if kind is bool:
      if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"config argument {key} needs true or false, got {value!r}")
      args[key] = value.lower() in ("true", "1")
    else:
      try:
        args[key] = kind(value)
      except ValueError:
        raise ValueError(f"config argument {key} needs a {kind.__name__}, "
                         f"got {value!r}") from None
  return args


# Precision presets (`:precision=NAME` in the family configs). dtype is the compute dtype
# (activations and matmul inputs; softmax, norms and the loss stay float32), param_dtype the
# stored weights, which the optimizer's moments follow (optax's default) and to which updates
# are applied. bf16 is mixed precision for GPU/TPU training: bfloat16 compute on float32
# master weights and optimizer state.
PRECISIONS = {
    "fp32": dict(dtype="float32", param_dtype="float32"),
    "bf16": dict(dtype="bfloat16", param_dtype="float32"),
}


def precision_config(name: str) -> dict:
  if name not in PRECISIONS:
    raise ValueError(f"unknown precision {name!r}; valid: {list(PRECISIONS)}")
  return dict(PRECISIONS[name])


def size_config(size: str) -> dict:
  if size not in SIZES:
    raise ValueError(f"unknown size {size!r}; valid: {list(SIZES)}")
  return dict(SIZES[size])


def train_config(**overrides) -> ml_collections.ConfigDict:
  """The loop: length, batch, cadence of logs/evals/checkpoints. Steps count updates."""
  cfg = ml_collections.ConfigDict(dict(
      steps=1000,
      batch_size=32,  # global, in sequences; split over data x fsdp and all hosts
      seed=0,
      log_every=50,
      eval_every=250,  # a multiple of checkpoint_every lets "keep the best" see each eval
      eval_batches=8,
      # The order the eval windows are drawn in. Not train.seed: runs that differ only in
      # their seed are scored on the same tokens (python_stdlib's windows differ by 0.35 nats).
      eval_seed=0,
      train_split="train",
      eval_split="validation",
      checkpoint_every=250,
      keep_checkpoints=3,  # the most recent ones, plus the best (by eval loss) ones:
      keep_best=1,
      async_checkpoint=True,
      data_shards=0,  # data streams the global batch is cut into; 0 = one per process
      peak_flops=0.0,  # per device, for MFU; 0 = look up the chip or measure a CPU
      # WORKDIR[:STEP]: a new run starts from that run's (or transformer.convert --from_hf
      # directory's) parameters only: fresh optimizer, step 0, data from the start. The
      # model keys must match (RUNTIME_KEYS may differ). Ignored once this run has its own
      # checkpoint: resuming resumes. "" = initialize randomly.
      init_from="",
      # START:END: a jax.profiler trace of steps START..END-1 in <workdir>/profile
      # (docs/training.md#logs-trackers-and-profiles); "" = none.
      profile_steps="",
  ))
  cfg.update(overrides)
  return cfg


def log_config(**overrides) -> ml_collections.ConfigDict:
  """Where a run reports besides its workdir's files. Runtime settings: a resume may change
  them (only model and data-stream keys are checked against a checkpoint)."""
  cfg = ml_collections.ConfigDict(dict(
      wandb_project="",  # a W&B project to log to (the wandb extra); "" = off
  ))
  cfg.update(overrides)
  return cfg


def opt_config(**overrides) -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict(dict(
      name="adamw",  # adamw | adafactor | lion | sgd
      lr=3e-3,
      schedule="cosine",  # cosine | linear | rsqrt | constant | wsd
      warmup_steps=100,
      min_lr_ratio=0.1,  # cosine / linear / wsd end at lr * min_lr_ratio
      decay_fraction=0.2,  # wsd: the share of steps spent cooling down
      weight_decay=0.1,  # on matrices only; never on norm scales or biases
      b1=0.9,
      b2=0.95,
      eps=1e-8,
      momentum=0.9,  # sgd
      nesterov=False,  # sgd
      adafactor_momentum=False,
      clip_norm=1.0,  # global gradient norm; 0 = off
      grad_accum_steps=1,  # micro-batches per update (same result, less activation memory)
  ))
  cfg.update(overrides)
  return cfg


def objective_config(name: str, **overrides) -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict(dict(
      name=name,  # lm | mlm | seq2seq
      label_smoothing=0.0,
      z_loss=0.0,  # PaLM uses 1e-4
  ))
  cfg.update(overrides)
  return cfg


def experiment_config(model, data, objective, **train_overrides) -> ml_collections.ConfigDict:
  """The whole experiment: model, data, objective, train, opt, log and mesh blocks."""
  return ml_collections.ConfigDict(dict(
      model=model,
      data=data,
      objective=objective,
      train=train_config(**train_overrides),
      opt=opt_config(),
      log=log_config(),
      # (data, fsdp, tensor); one entry may be -1 = all remaining devices.
      mesh=ml_collections.ConfigDict(dict(shape=(-1, 1, 1))),
  ))


def flatten(d: dict, prefix: str = "") -> dict:
  """{"a": {"b": 1}} -> {"a.b": 1}: configs as flat key lists, for diffs and summaries."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out
