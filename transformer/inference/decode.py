"""Generation: a KV cache filled by one parallel prefill, then one token per step.

    prefill  the prompt in one pass; every self-attention layer stores its keys and values
             (an encoder-decoder also stores cross-attention keys/values of the encoder output)
    step     each new token computes only its own query, key and value, appends them and
             compares its query with everything stored: work per token grows with n, not n^2

Batches are LEFT-padded: every row's last prompt token sits at index P - 1, so all rows share
one index per step and one slot write serves the batch. Padding has segment 0 and pad id 0;
each row's positions start at 0 at its first real token, so every positional scheme sees the
positions it would see for that prompt alone. Token index i lives in cache slot i % S_cache,
where S_cache is the total length, or the window when the model has one: a ring whose oldest
key is overwritten exactly when it leaves the window.

  tokens_BT = generate(model, params, [[1, 17, 42], [1, 9]], max_new_tokens=20,
                       sampling=Sampling(temperature=0.8, top_p=0.95), seed=0)
  tokens_BWT, scores_BW = beam_search.beam_search(model, params, [[1]], max_new_tokens=20,
                                                  beam_size=4, encoder_inputs=[[7, 8, 9, 2]])
  (beam search is transformer/inference/beam_search.py, on the same cache and steps)

The whole decode loop is one compiled program (lax.while_loop); sampling settings and stop
tokens (up to 8 of them) are traced values, so changing them does not recompile; prompts (and encoder inputs)
are padded up to a bucket length (`bucket_length`: 8, 16, 32, 64, then multiples of 64), so
prompts of nearby lengths reuse one compiled loop too.

With `mesh=`, the rows are split over the mesh's "data" axis and the parameters replicated:
each device decodes its rows with its own cache (the loop's only collective is the "every row
stopped" test). On a CPU with `jax_num_cpu_devices` = cores that puts every core on reading
the cache, which one device's small batched dots do on one thread (docs/performance.md).
"""

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct

from transformer import schema
from transformer.model import models, positions
from transformer.model.attention import Layout, make_layout

# Every tokenizer in transformer.data uses these ids.
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

KINDS = ("decoder", "encoder_decoder")
# Approximations of softmax attention (or a different pattern) that a cached step, which
# uses exact softmax over the cache, would not reproduce.
UNSUPPORTED_ATTENTION = schema.APPROXIMATE_ATTENTION


# ---------------------------------------------------------------------------------------------
# Checks and the padded batch.

def check_model(cfg: ml_collections.ConfigDict) -> None:
  if cfg.kind not in KINDS:
    raise ValueError(f"generation needs model.kind in {KINDS}, got {cfg.kind!r}: an encoder "
                     f"has no next-token distribution to decode from.")
  if cfg.attention in UNSUPPORTED_ATTENTION:
    raise ValueError(f"generation does not support model.attention={cfg.attention!r} (a cached "
                     f"step is exact softmax attention); use 'dense', 'chunked' or 'auto'.")


def cache_length(cfg: ml_collections.ConfigDict, length: int) -> int:
  """Slots per sequence: the whole length, or the window when one bounds what is seen."""
  return min(length, cfg.window) if cfg.window else length


def check_lengths(cfg, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
  if not prompts:
    raise ValueError("no prompts: pass a list of token lists.")
  if any(len(p) == 0 for p in prompts):
    raise ValueError("empty prompt: generation needs at least one token to condition on "
                     f"(start a decoder prompt with BOS = {BOS_ID}).")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
  longest = max(len(p) for p in prompts)
  check_ids(cfg, prompts)
  limit = position_limit(cfg)
  if longest + max_new_tokens > limit:
    raise ValueError(f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                     f"the learned position table (model.max_len={limit}); shorten one.")


def position_limit(cfg) -> int:
  """The longest sequence the model's positions hold (a learned table's model.max_len)."""
  return positions.SCHEMES[cfg.position.name](cfg).max_length()


def check_ids(cfg, sequences) -> None:
  # An id past the table would be gathered as NaN, silently.
  bad = [t for s in sequences for t in s if not 0 <= t < cfg.vocab_size]
  if bad:
    raise ValueError(f"token id {bad[0]} outside the vocabulary [0, {cfg.vocab_size}).")


def bucket_length(n: int) -> int:
  """The padded length a batch of at most n tokens is compiled for: a power of two up to 64,
  then a multiple of 64. Padding is masked (segment 0), so it changes no logit; it lets
  prompts of other lengths reuse a compiled loop instead of compiling one per length (a
  second or more each) at the cost of at most 64 masked columns."""
  if n <= 64:
    return max(8, 1 << (n - 1).bit_length())
  return -(-n // 64) * 64


def padded_length(cfg, sequences, max_new_tokens: int) -> int:
  """The bucket of the longest sequence, cut to what a learned position table holds (the
  padded prompt runs through it at prefill); at least the longest (check_lengths)."""
  longest = max(len(s) for s in sequences)
  limit = position_limit(cfg) - max_new_tokens
  return int(max(longest, min(bucket_length(longest), limit)))


def _pad(sequences: Sequence[Sequence[int]], length: int | None, left: bool) -> np.ndarray:
  """[B, max(longest, length)] int32 on PAD_ID, each sequence at the right or left end."""
  n = max(max(len(s) for s in sequences), length or 0)
  out = np.full((len(sequences), n), PAD_ID, np.int32)
  for row, s in zip(out, sequences):
    row[n - len(s) if left else 0:][:len(s)] = s
  return out


def left_pad(prompts: Sequence[Sequence[int]],
             length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_BP, start_B): prompts right-aligned on PAD_ID; start_B is each first real index.
  P is the longest prompt, or `length` when given (>= the longest)."""
  tokens_BP = _pad(prompts, length, left=True)
  return tokens_BP, np.asarray([tokens_BP.shape[1] - len(p) for p in prompts], np.int32)


def right_pad(sequences: Sequence[Sequence[int]],
              length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_BS, segment_ids_BS) for the encoder, which is bidirectional: any side works.
  S is the longest sequence, or `length` when given (>= the longest)."""
  tokens_BS = _pad(sequences, length, left=False)
  lengths_B1 = np.asarray([[len(s)] for s in sequences])
  return tokens_BS, (np.arange(tokens_BS.shape[1])[None] < lengths_B1).astype(np.int32)


def padded_inputs(start_B, length):
  """(segment_ids, positions) [B, length] of a left-padded batch: what a full forward pass
  takes to see the same sequences as the cache."""
  idx_BL = jnp.arange(length, dtype=jnp.int32)[None]
  start = jnp.asarray(start_B, jnp.int32)[:, None]
  return (idx_BL >= start).astype(jnp.int32), jnp.maximum(idx_BL - start, 0)


# ---------------------------------------------------------------------------------------------
# Layouts: which cached key each new query may see, and at which positions.

def prompt_layout(start_B, P: int, window: int) -> Layout:
  seg_BP, pos_BP = padded_inputs(start_B, P)
  return make_layout(P, P, batch=seg_BP.shape[0], q_segments=seg_BP, k_segments=seg_BP,
                     q_positions=pos_BP, k_positions=pos_BP, causal=True, window=window)


def step_layout(index, start_B, slots: int, window: int) -> Layout:
  """One query at token index `index` against the cache's slots.

  Slot s holds the latest token index i <= index with i % slots == s, which is
  index - ((index - s) mod slots); slots never written come out negative and are masked like
  padding (segment 0), as are the left pads of each row."""
  B = start_B.shape[0]
  start_B1 = start_B[:, None]
  q_idx_B1 = jnp.full((B, 1), index, jnp.int32)
  k_idx_S = index - (index - jnp.arange(slots, dtype=jnp.int32)) % slots
  k_idx_BS = jnp.broadcast_to(k_idx_S, (B, slots))
  return Layout(q_seg_BL=jnp.ones((B, 1), jnp.int32),
                k_seg_BS=(k_idx_BS >= start_B1).astype(jnp.int32),
                q_idx_BL=q_idx_B1, k_idx_BS=k_idx_BS,
                q_pos_BL=q_idx_B1 - start_B1, k_pos_BS=jnp.maximum(k_idx_BS - start_B1, 0),
                causal=True, window=window)


# ---------------------------------------------------------------------------------------------
# Cache, prefill and step.

@struct.dataclass
class DecodeState:
  cache: Any  # the 'cache' collection: cached_key/cached_value per layer, blocks [B, K, b_j, H]
  index: jax.Array  # int32 scalar: token index of the next token fed (padding included)
  start_B: jax.Array  # first real token index of each row
  encoded_BSD: jax.Array | None = None  # encoder-decoder only
  encoder_segment_ids_BS: jax.Array | None = None
  slots: int = struct.field(pytree_node=False, default=0)


def frozen(model):
  """The same model with a frozen (hashable) config, so compiled programs can be keyed on it."""
  return models.make_model(ml_collections.FrozenConfigDict(model.cfg))


def _extend(model, params, cache, tokens_BL, layout, mode, encoded=None, enc_seg=None):
  """logits_BLV and the updated cache from one cached call of the model."""
  variables = {"params": params} if cache is None else {"params": params, "cache": cache}
  enc = () if model.cfg.kind == "decoder" else (encoded, enc_seg)
  logits, state = model.apply(variables, *enc, tokens_BL, layout, mode, method="extend",
                              mutable=["cache"])
  return logits, state["cache"]


def encode(model, params, encoder_inputs_BS, encoder_segment_ids_BS):
  return model.apply({"params": params}, encoder_inputs_BS, encoder_segment_ids_BS,
                     method="encode")


def init_cache(model, params, batch: int, length: int, encoded_BSD=None,
               encoder_segment_ids_BS=None):
  """Zero caches for `batch` sequences of `length` tokens: every layer's shapes come from an
  abstract prefill of the cache's length (nothing is computed)."""
  slots = cache_length(model.cfg, length)
  dummy = jnp.zeros((batch, slots), jnp.int32)
  layout = prompt_layout(jnp.zeros((batch,), jnp.int32), slots, model.cfg.window)
  shapes = jax.eval_shape(
      lambda: _extend(model, params, None, dummy, layout, "prefill", encoded_BSD,
                      encoder_segment_ids_BS)[1])
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def prefill(model, params, tokens_BP, start_B, length: int, encoded_BSD=None,
            encoder_segment_ids_BS=None):
  """Run the left-padded prompts in one pass into a cache for `length` tokens in all.
  Returns (logits_BPV, state)."""
  B, P = tokens_BP.shape
  start_B = jnp.asarray(start_B, jnp.int32)
  cache = init_cache(model, params, B, length, encoded_BSD, encoder_segment_ids_BS)
  logits_BPV, cache = _extend(model, params, cache, tokens_BP,
                              prompt_layout(start_B, P, model.cfg.window), "prefill",
                              encoded_BSD, encoder_segment_ids_BS)
  return logits_BPV, DecodeState(cache, jnp.asarray(P, jnp.int32), start_B, encoded_BSD,
                                 encoder_segment_ids_BS, cache_length(model.cfg, length))


def step(model, params, state: DecodeState, tokens_B):
  """Feed one token per row; returns (logits_BV of the next token, state)."""
  layout = step_layout(state.index, state.start_B, state.slots, model.cfg.window)
  logits_B1V, cache = _extend(model, params, state.cache, tokens_B[:, None], layout, "step",
                              state.encoded_BSD, state.encoder_segment_ids_BS)
  return logits_B1V[:, 0], state.replace(cache=cache, index=state.index + 1)


def cache_nbytes(cache) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(cache))


# ---------------------------------------------------------------------------------------------
# Sampling.

@dataclasses.dataclass(frozen=True)
class Sampling:
  """temperature 0 is greedy (argmax); top_k 0 and top_p 1 switch those filters off."""
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
    if not (isinstance(self.top_k, (int, np.integer)) and self.top_k >= 0):
      raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}.")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}.")

  def traced(self):
    return (jnp.float32(self.temperature), jnp.int32(self.top_k), jnp.float32(self.top_p))


def sample(logits_BV, rng, temperature, top_k, top_p):
  """One token per row. All three settings may be traced: filters act through thresholds on
  the sorted logits, so one compiled program serves every setting. Greedy decoding (temperature
  0) takes a lax.cond branch that is only the argmax: the sort, the cumulative sum and the
  random draw would otherwise run every step for nothing."""
  logits_BV = logits_BV.astype(jnp.float32)
  greedy = lambda: jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  return jax.lax.cond(temperature > 0, lambda: _draw(logits_BV, rng, temperature, top_k, top_p),
                      greedy)


def _draw(logits_BV, rng, temperature, top_k, top_p):
  V = logits_BV.shape[-1]
  scaled = logits_BV / jnp.maximum(temperature, 1e-6)
  sorted_BV = -jnp.sort(-scaled, axis=-1)  # descending
  # top-k: drop everything below the k-th largest logit.
  kth_B1 = jax.lax.dynamic_index_in_dim(sorted_BV, jnp.clip(top_k - 1, 0, V - 1), axis=1)
  keep_k = jnp.where(top_k > 0, scaled >= kth_B1, True)
  # top-p (nucleus): the smallest set of most likely tokens whose mass reaches p; a token is
  # in it if the mass strictly before it is < p, so the most likely token always is.
  probs_sorted = jax.nn.softmax(jnp.where(
      jnp.arange(V) < jnp.where(top_k > 0, top_k, V), sorted_BV, -jnp.inf), axis=-1)
  before_BV = jnp.cumsum(probs_sorted, axis=-1) - probs_sorted
  n_keep_B1 = jnp.sum(before_BV < top_p, axis=-1, keepdims=True)
  pth_B1 = jnp.take_along_axis(sorted_BV, n_keep_B1 - 1, axis=-1)
  keep = keep_k & (scaled >= pth_B1)
  return jax.random.categorical(rng, jnp.where(keep, scaled, -jnp.inf)).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# The generation loop.

def _prepare(model, prompts, max_new_tokens, encoder_inputs):
  """Checks, padding and the encoder side: (frozen model, tokens_BP, start_B, encoder args),
  both sides padded to bucket_length so the compiled loop serves nearby lengths too."""
  check_model(model.cfg)
  kind = model.cfg.kind
  if kind == "encoder_decoder":
    if encoder_inputs is None:
      raise ValueError("an encoder-decoder model needs encoder_inputs (a list of token lists).")
    if prompts is None:
      prompts = [[BOS_ID]] * len(encoder_inputs)
    if len(prompts) != len(encoder_inputs):
      raise ValueError(f"{len(prompts)} decoder prompts for {len(encoder_inputs)} encoder "
                       f"inputs; pass one each.")
    if not encoder_inputs or any(len(e) == 0 for e in encoder_inputs):
      raise ValueError("empty encoder input: the encoder needs at least one token per row.")
    check_ids(model.cfg, encoder_inputs)
    longest, limit = max(map(len, encoder_inputs)), position_limit(model.cfg)
    if longest > limit:  # else the position table's own error, which says to raise max_len
      raise ValueError(f"encoder input ({longest} tokens) exceeds the learned position table "
                       f"(model.max_len={limit}); shorten it.")
    enc = right_pad(encoder_inputs, padded_length(model.cfg, encoder_inputs, 0))
  else:
    if encoder_inputs is not None:
      raise ValueError("encoder_inputs given to a decoder-only model.")
    enc = (None, None)
  check_lengths(model.cfg, prompts, max_new_tokens)
  tokens_BP, start_B = left_pad(prompts, padded_length(model.cfg, prompts, max_new_tokens))
  return frozen(model), tokens_BP, start_B, enc


def _encoded(model, params, enc_tokens, enc_seg):
  if enc_tokens is None:
    return None, None
  return encode(model, params, enc_tokens, enc_seg), enc_seg


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "return_logits"))
def _generate(model, params, tokens_BP, start_B, enc_tokens, enc_seg, stop_tokens, rng,
              sampling, *, max_new_tokens, return_logits):
  B, P = tokens_BP.shape
  encoded, enc_seg = _encoded(model, params, enc_tokens, enc_seg)
  logits_BPV, state = prefill(model, params, tokens_BP, start_B, P + max_new_tokens, encoded,
                              enc_seg)
  V = logits_BPV.shape[-1]

  def pick(logits_BV, t, done_B):
    token_B = sample(logits_BV, jax.random.fold_in(rng, t), *sampling)
    token_B = jnp.where(done_B, PAD_ID, token_B)  # finished rows emit padding
    return token_B, done_B | jnp.isin(token_B, stop_tokens)

  first_B, done_B = pick(logits_BPV[:, -1], 0, jnp.zeros((B,), bool))
  out_BT = jnp.full((B, max_new_tokens), PAD_ID, jnp.int32).at[:, 0].set(first_B)
  # The logits each token was drawn from (tests and scoring): the prompt's, then each step's.
  seen_BXV = jnp.zeros((B, 0, V), jnp.float32)
  if return_logits:
    seen_BXV = jnp.zeros((B, P + max_new_tokens - 1, V), jnp.float32).at[:, :P].set(logits_BPV)

  def cond(carry):
    t, _, done_B, _, _, _ = carry
    return (t < max_new_tokens) & ~jnp.all(done_B)

  def body(carry):
    t, token_B, done_B, out_BT, seen_BXV, state = carry
    logits_BV, state = step(model, params, state, token_B)
    token_B, done_B = pick(logits_BV, t, done_B)
    if return_logits:
      seen_BXV = jax.lax.dynamic_update_slice_in_dim(seen_BXV, logits_BV[:, None], P + t - 1, 1)
    return t + 1, token_B, done_B, out_BT.at[:, t].set(token_B), seen_BXV, state

  carry = (jnp.int32(1), first_B, done_B, out_BT, seen_BXV, state)
  _, _, _, out_BT, seen_BXV, _ = jax.lax.while_loop(cond, body, carry)
  return out_BT, seen_BXV


def split_rows(mesh: jax.sharding.Mesh, params, *arrays_B):
  """The parameters replicated over `mesh` and each array's rows split over its "data" axis,
  rows padded (repeating the last) to a multiple of it: (params, arrays..., rows before)."""
  if "data" not in mesh.axis_names:
    raise ValueError(f"mesh axes {mesh.axis_names}: generate splits rows over a 'data' axis.")
  if any(size > 1 for name, size in mesh.shape.items() if name != "data"):
    raise ValueError(f"mesh {dict(mesh.shape)}: generate replicates the parameters, so only "
                     f"its 'data' axis may be larger than 1.")
  n, B = mesh.shape["data"], len(arrays_B[0])
  pad = -B % n
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

  def place(a):
    if a is None:  # a decoder's absent encoder inputs
      return None
    a = np.asarray(a)
    return jax.device_put(np.concatenate([a, np.repeat(a[-1:], pad, 0)]) if pad else a, rows)

  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return (jax.device_put(params, replicated), *(place(a) for a in arrays_B), B)


def generate(model, params, prompts: Sequence[Sequence[int]] | None, *, max_new_tokens: int,
             sampling: Sampling = Sampling(), seed: int = 0,
             stop_tokens: Sequence[int] = (EOS_ID,), encoder_inputs=None,
             return_logits: bool = False, mesh: jax.sharding.Mesh | None = None):
  """New tokens [B, max_new_tokens] (int32 numpy) for a batch of prompts (token lists).

  A row that emits a stop token keeps it and is padded (PAD_ID) after it; the loop ends when
  every row has stopped. Encoder-decoder models take `encoder_inputs` and default their
  decoder prompts to [BOS]. With return_logits, also the float32 logits [B, P + T - 1, V] at
  every position of the left-padded sequence (prompt then generated tokens) whose next token
  is known: the prompt's from prefill, then one per step (zeros after an early stop).
  `mesh`: split the rows over its "data" axis (module docstring); the tokens are the same.
  """
  if not isinstance(sampling, Sampling):
    raise TypeError(f"sampling must be a decode.Sampling, got {type(sampling).__name__}.")
  model, tokens_BP, start_B, (enc_tokens, enc_seg) = _prepare(model, prompts, max_new_tokens,
                                                              encoder_inputs)
  # Padded with -1 (no token) to a multiple of 8, so the count of stop tokens is not a shape.
  stops = list(stop_tokens)
  stops = jnp.asarray(stops + [-1] * (max(8, -(-len(stops) // 8) * 8) - len(stops)), jnp.int32)
  first = int(np.min(start_B))
  B = len(tokens_BP)
  if mesh is not None:
    params, tokens_BP, start_B, enc_tokens, enc_seg, B = split_rows(
        mesh, params, tokens_BP, start_B, enc_tokens, enc_seg)
  out_BT, logits = _generate(model, params, tokens_BP, start_B, enc_tokens, enc_seg, stops,
                             jax.random.key(seed), sampling.traced(),
                             max_new_tokens=max_new_tokens, return_logits=return_logits)
  out_BT = np.asarray(out_BT)[:B]
  if not return_logits:
    return out_BT
  # The bucket's extra left pads are not part of the batch the caller gave: its columns start
  # where the longest prompt does.
  return out_BT, np.asarray(logits)[:B, first:]
