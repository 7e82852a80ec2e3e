"""What a model config costs, without allocating its weights (jax.eval_shape).

  python -m transformer.inspect --config configs/arch/llama3_8b.py [--json] [--length 100000]
(the command is transformer/inspect.py; `report(cfg, ...)` is the arithmetic.)

Counts come from the real module's abstract parameters, so they cannot drift from the model.
Conventions:
  * non-embedding parameters exclude the token table, an untied output projection, learned
    position tables and token-type tables (Kaplan et al. 2020);
  * training FLOPs per token = 6 N + 6 n_layers n_ctx d_attn (Kaplan et al. 2020, Table 1:
    forward 2N + 2 n_layer n_ctx d_attn, backward twice that), N non-embedding, d_attn =
    num_heads * head_dim, n_ctx the sequence length; for an encoder-decoder both stacks count;
    also with N = all parameters (Chinchilla, Porian et al. 2024: the tied output projection
    is 6 V d per token), as `total_params_convention`;
  * attention comparisons count query-key dot products per head per layer, as the seed does.
"""

import math

import jax
import ml_collections
import numpy as np

from transformer.model import models
from transformer.model.positions import rope_frequencies

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "float8": 1}


def _abstract_params(cfg):
  model = models.make_model(cfg)
  shapes = jax.eval_shape(model.init, jax.random.key(0), *models.dummy_inputs(cfg, 1, 2))
  return shapes["params"]


def _size(tree) -> int:
  leaves = jax.tree.leaves(tree, is_leaf=lambda x: hasattr(x, "unbox"))
  return int(sum(math.prod((x.unbox() if hasattr(x, "unbox") else x).shape) for x in leaves))


def _embedding_like(path) -> bool:
  names = [getattr(k, "key", str(k)) for k in path]
  last = names[-1]
  return (last in ("embedding", "token_type_embedding", "pos_embedding")
          or (names[-2:] == ["logits", "kernel"]))


def _layers_of(tower):
  """The per-layer param subtrees of a tower and how many layers each holds: a scanned stack
  is one subtree whose leading axis is the tower's own depth (an encoder-decoder's towers may
  differ from num_layers and from each other)."""
  stack = tower["stack"]
  if "layers" in stack:
    leaf = jax.tree.leaves(stack["layers"], is_leaf=lambda x: hasattr(x, "unbox"))[0]
    leaf = leaf.unbox() if hasattr(leaf, "unbox") else leaf
    return [stack["layers"]], leaf.shape[0]
  return [stack[f"layers_{i}"] for i in range(len(stack))], 1


def param_totals(params) -> tuple[int, int]:
  """(total, non-embedding) sizes of a (possibly abstract, possibly boxed) param tree."""
  flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: hasattr(x, "unbox"))[0]
  total = _size(params)
  return total, total - sum(_size(x) for path, x in flat if _embedding_like(path))


def count_params(cfg: ml_collections.ConfigDict) -> dict:
  """Total, non-embedding, per-block attention / feed-forward / norm, feed-forward share."""
  params = _abstract_params(cfg)
  total, non_embedding = param_totals(params)
  embedding = total - non_embedding
  towers = {k: v for k, v in params.items() if k in ("tower", "encoder", "decoder")}
  per_block, ffn_total = {}, 0
  for name, tower in towers.items():
    layers, scan = _layers_of(tower)
    first = layers[0]
    attn = sum(_size(first[k]) for k in ("self_attention", "cross_attention") if k in first)
    ffn = _size(first["ffn"])
    norms = sum(_size(v) for k, v in first.items() if k.endswith("_norm"))
    n_layers = len(layers) * scan
    per_block[name] = dict(attention=attn // scan, ffn=ffn // scan, norms=norms // scan,
                           num_layers=n_layers)
    ffn_total += sum(_size(layer["ffn"]) for layer in layers)
  return dict(total=total, non_embedding=total - embedding, embedding=embedding,
              per_block=per_block, ffn_share=ffn_total / total)


def _attention_layers(cfg) -> int:
  if cfg.kind == "encoder_decoder":
    return (cfg.num_encoder_layers or cfg.num_layers) + 2 * (cfg.num_decoder_layers or
                                                             cfg.num_layers)
  return cfg.num_layers


def flops_per_token(cfg: ml_collections.ConfigDict, seq_len: int, non_embedding=None,
                    params_total=None) -> dict:
  """Training FLOPs per token (forward + backward) in both conventions.

  `total` (the key's meaning is unchanged: the sum of the terms) is Kaplan et al.'s
  6 N_non_embedding + attention; `total_params_convention` is Chinchilla's / Porian et al.'s
  6 N_total + attention, N_total counting the tied embedding = output projection (whose
  matmul is 6 V d per token of training).
  """
  counts = None
  if non_embedding is None or params_total is None:
    counts = count_params(cfg)
  n = counts["non_embedding"] if non_embedding is None else non_embedding
  n_total = counts["total"] if params_total is None else params_total
  d_attn = cfg.num_heads * models.head_dim(cfg)
  context = min(seq_len, cfg.window) if cfg.window else seq_len
  attention = 6 * _attention_layers(cfg) * context * d_attn
  return dict(total=6 * n + attention, dense=6 * n, attention=attention,
              total_params_convention=6 * n_total + attention,
              formula=f"6*N + 6*n_attn_layers*n_ctx*d_attn = 6*{n} + 6*"
                      f"{_attention_layers(cfg)}*{context}*{d_attn}",
              formula_total_params=f"6*N_total + 6*n_attn_layers*n_ctx*d_attn = 6*{n_total}"
                                   f" + 6*{_attention_layers(cfg)}*{context}*{d_attn}")


def kv_cache_bytes(cfg: ml_collections.ConfigDict, length: int, dtype_bytes: int,
                   encoder_length: int = 0) -> int:
  """Bytes of keys and values a decode cache holds for one sequence of `length` tokens.

  Decoder self-attention keeps K heads of head_dim per layer (bounded by the window); an
  encoder-decoder also keeps cross-attention keys/values of its `encoder_length` tokens.
  """
  per_token = 2 * models.num_kv_heads(cfg) * models.head_dim(cfg) * dtype_bytes
  if cfg.kind == "encoder":
    return 0
  layers = cfg.num_decoder_layers or cfg.num_layers if cfg.kind == "encoder_decoder" else (
      cfg.num_layers)
  kept = min(length, cfg.window) if cfg.window else length
  cross = encoder_length if cfg.kind == "encoder_decoder" else 0
  return layers * per_token * (kept + cross)


def comparisons(n_new: int, prompt: int = 0) -> dict:
  """Query-key dot products per head per layer to generate n_new tokens after a prompt.

  With a cache, token t (1-based) compares its query with t keys; without one, every step
  recomputes the whole triangle t (t + 1) / 2."""
  steps = range(prompt + 1, prompt + n_new + 1)
  return dict(with_cache=sum(steps), without_cache=sum(t * (t + 1) // 2 for t in steps))


def _first_length_above(cache_bytes, limit: int, longest: int = 1 << 40) -> int | None:
  """The fewest tokens whose cache exceeds `limit` bytes (cache_bytes grows with the length
  and stops at a sliding window); None when even `longest` tokens stay within it."""
  if cache_bytes(longest) <= limit:
    return None
  low, high = 0, longest  # cache_bytes(low) <= limit < cache_bytes(high)
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if cache_bytes(mid) <= limit else (low, mid)
  return high


def report(cfg: ml_collections.ConfigDict, length: int | None = None, dtype: str = "bfloat16",
           new_tokens: int = 40) -> dict:
  model = cfg.model if "model" in cfg else cfg
  models.validate(model)
  length = model.max_len if length is None else length
  if length < 1 or new_tokens < 0:
    raise ValueError(f"--length must be >= 1 and --new_tokens >= 0, got {length} and "
                     f"{new_tokens}")
  if model.position.name == "learned" and length > model.max_len:
    raise ValueError(f"--length={length} exceeds the learned position table "
                     f"(model.max_len={model.max_len}); pass a shorter --length")
  dbytes = DTYPE_BYTES[dtype]
  params = count_params(model)
  # The training context: an experiment config's (or run's) data.seq_len, as the train
  # command and the scaling sweeps count FLOPs; a bare model config's max_len.
  seq_len = cfg.data.get("seq_len") if "model" in cfg and "data" in cfg else None
  context = dict(tokens=seq_len or model.max_len,
                 source="data.seq_len" if seq_len else "model.max_len")
  flops = flops_per_token(model, context["tokens"], params["non_embedding"], params["total"])
  out = dict(kind=model.kind, params=params, flops_per_token=flops["total"],
             flops_per_token_total_params=flops["total_params_convention"],
             flops_per_token_terms=flops, flops_context=context)
  param_bytes = params["total"] * DTYPE_BYTES.get(model.param_dtype, 4)
  # An encoder-decoder's cache also holds the cross-attention keys and values of its source:
  # counted at a source as long as the target.
  cache = lambda cfg, n: kv_cache_bytes(cfg, n, dbytes, encoder_length=n)
  per_token = cache(model, 1)
  kv = dict(dtype=dtype, bytes_per_token=per_token, bytes_at_max_len=cache(model, model.max_len),
            length=length, bytes_at_length=cache(model, length),
            with_source=model.kind == "encoder_decoder")
  if per_token:
    mha = ml_collections.ConfigDict(model.to_dict())
    mha.num_kv_heads = model.num_heads
    kv["bytes_at_length_one_kv_per_head"] = cache(mha, length)
    kv["param_bytes"] = param_bytes
    kv["tokens_where_cache_outweighs_weights"] = _first_length_above(
        lambda n: cache(model, n), param_bytes)
  out["kv_cache"] = kv
  out["score_entries_per_head"] = dict(length=length, entries=length * length)
  out["comparisons"] = dict(new_tokens=new_tokens, **comparisons(new_tokens))
  if model.position.name == "rope":
    inv_freq, _, rot = rope_frequencies(model.position, models.head_dim(model), model.max_len)
    out["rope"] = dict(pairs=rot // 2,
                       fastest_degrees_per_token=float(np.degrees(inv_freq.max())),
                       slowest_tokens_per_turn=float(2 * np.pi / inv_freq.min()))
  return out


def _human(n: float, unit: str = "") -> str:
  for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(n) >= scale:
      return f"{n / scale:.2f} {suffix}{unit}"
  return f"{n:.0f} {unit}"


def print_report(r: dict) -> None:
  p, kv = r["params"], r["kv_cache"]
  print(f"kind: {r['kind']}")
  print(f"parameters: {p['total']:,} total, {p['non_embedding']:,} non-embedding "
        f"({p['embedding']:,} in embeddings/output tables)")
  for name, b in p["per_block"].items():
    print(f"  per {name} block (x{b['num_layers']}): attention {b['attention']:,}, "
          f"feed-forward {b['ffn']:,}, norms {b['norms']:,}")
  print(f"  feed-forward share of all parameters: {100 * p['ffn_share']:.1f}%")
  f = r["flops_per_token_terms"]
  ctx = r["flops_context"]
  print(f"training FLOPs per token at {ctx['tokens']:,} tokens of context ({ctx['source']}): "
        f"{_human(f['total'], 'FLOP')}  ({f['formula']}; non-embedding N, Kaplan)")
  print(f"  counting all parameters: {_human(f['total_params_convention'], 'FLOP')}  "
        f"({f['formula_total_params']}; Chinchilla / Porian)")
  if kv["bytes_per_token"]:
    source = " (target tokens, with a source as long)" if kv["with_source"] else ""
    print(f"KV cache ({kv['dtype']}): {kv['bytes_per_token']:,} bytes per token; "
          f"{_human(kv['bytes_at_length'], 'B')} at {kv['length']:,} tokens; "
          f"{_human(kv['bytes_at_length_one_kv_per_head'], 'B')} with one KV set per head"
          + source)
    past = kv["tokens_where_cache_outweighs_weights"]
    print(f"  one sequence's cache outweighs the weights ({_human(kv['param_bytes'], 'B')}) "
          + (f"past {past:,} tokens" if past else "at no length: the window bounds it"))
  s = r["score_entries_per_head"]
  print(f"score-matrix entries per head at {s['length']:,} tokens: {s['entries']:,}")
  c = r["comparisons"]
  print(f"comparisons to generate {c['new_tokens']} tokens: {c['with_cache']:,} with a cache, "
        f"{c['without_cache']:,} without")
  if "rope" in r:
    ro = r["rope"]
    print(f"RoPE: {ro['pairs']} pairs from {ro['fastest_degrees_per_token']:.1f} degrees per "
          f"token to one turn every {ro['slowest_tokens_per_turn']:,.0f} tokens")

