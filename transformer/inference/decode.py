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
  tokens_BWT, scores_BW = beam_search(model, params, [[1]], max_new_tokens=20, beam_size=4,
                                      encoder_inputs=[[7, 8, 9, 2]])

The whole decode loop is one compiled program (lax.while_loop); sampling settings and stop
tokens are traced values, so changing them does not recompile.
"""

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct

from transformer import models, positions
from transformer.attention import Layout, make_layout

# Every tokenizer in transformer.data uses these ids.
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

KINDS = ("decoder", "encoder_decoder")
# Approximations of softmax attention (or a different pattern) that a cached step, which
# uses exact softmax over the cache, would not reproduce.
UNSUPPORTED_ATTENTION = ("linear", "block_sparse")


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
  limit = positions.SCHEMES[cfg.position.name](cfg).max_length()
  if longest + max_new_tokens > limit:
    raise ValueError(f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                     f"the learned position table (model.max_len={limit}); shorten one.")


def check_ids(cfg, sequences) -> None:
  # An id past the table would be gathered as NaN, silently.
  bad = [t for s in sequences for t in s if not 0 <= t < cfg.vocab_size]
  if bad:
    raise ValueError(f"token id {bad[0]} outside the vocabulary [0, {cfg.vocab_size}).")


def left_pad(prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_BP, start_B): prompts right-aligned on PAD_ID; start_B is each first real index."""
  P = max(len(p) for p in prompts)
  tokens_BP = np.full((len(prompts), P), PAD_ID, np.int32)
  for row, p in zip(tokens_BP, prompts):
    row[P - len(p):] = p
  return tokens_BP, np.asarray([P - len(p) for p in prompts], np.int32)


def right_pad(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_BS, segment_ids_BS) for the encoder, which is bidirectional: any side works."""
  S = max(len(s) for s in sequences)
  tokens_BS = np.full((len(sequences), S), PAD_ID, np.int32)
  for row, s in zip(tokens_BS, sequences):
    row[:len(s)] = s
  return tokens_BS, (np.arange(S)[None] < np.asarray([[len(s)] for s in sequences])).astype(
      np.int32)


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
  cache: Any  # the 'cache' collection: cached_key/cached_value [B, S_cache, K, H] per layer
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
  the sorted logits, so one compiled program serves every setting."""
  V = logits_BV.shape[-1]
  logits_BV = logits_BV.astype(jnp.float32)
  greedy_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
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
  sampled_B = jax.random.categorical(rng, jnp.where(keep, scaled, -jnp.inf)).astype(jnp.int32)
  return jnp.where(temperature > 0, sampled_B, greedy_B)


# ---------------------------------------------------------------------------------------------
# The generation loop.

def _prepare(model, prompts, max_new_tokens, encoder_inputs):
  """Checks, padding and the encoder side: (frozen model, tokens_BP, start_B, encoder args)."""
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
    enc = right_pad(encoder_inputs)
  else:
    if encoder_inputs is not None:
      raise ValueError("encoder_inputs given to a decoder-only model.")
    enc = (None, None)
  check_lengths(model.cfg, prompts, max_new_tokens)
  tokens_BP, start_B = left_pad(prompts)
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


def generate(model, params, prompts: Sequence[Sequence[int]] | None, *, max_new_tokens: int,
             sampling: Sampling = Sampling(), seed: int = 0,
             stop_tokens: Sequence[int] = (EOS_ID,), encoder_inputs=None,
             return_logits: bool = False):
  """New tokens [B, max_new_tokens] (int32 numpy) for a batch of prompts (token lists).

  A row that emits a stop token keeps it and is padded (PAD_ID) after it; the loop ends when
  every row has stopped. Encoder-decoder models take `encoder_inputs` and default their
  decoder prompts to [BOS]. With return_logits, also the float32 logits [B, P + T - 1, V] at
  every position of the left-padded sequence (prompt then generated tokens) whose next token
  is known: the prompt's from prefill, then one per step (zeros after an early stop).
  """
  if not isinstance(sampling, Sampling):
    raise TypeError(f"sampling must be a decode.Sampling, got {type(sampling).__name__}.")
  model, tokens_BP, start_B, (enc_tokens, enc_seg) = _prepare(model, prompts, max_new_tokens,
                                                              encoder_inputs)
  stops = jnp.asarray(list(stop_tokens) or [-1], jnp.int32)  # -1: no token stops
  out_BT, logits = _generate(model, params, tokens_BP, start_B, enc_tokens, enc_seg, stops,
                             jax.random.key(seed), sampling.traced(),
                             max_new_tokens=max_new_tokens, return_logits=return_logits)
  out_BT = np.asarray(out_BT)
  return (out_BT, np.asarray(logits)) if return_logits else out_BT


# ---------------------------------------------------------------------------------------------
# Beam search.

def length_penalty(length, alpha):
  """GNMT's ((5 + length) / 6) ** alpha (Wu et al. 2016): alpha 0 ranks by total log-prob;
  larger alpha favours longer hypotheses."""
  return ((5.0 + length) / 6.0) ** alpha


def _take_rows(state: DecodeState, rows_R) -> DecodeState:
  """The state of the given batch rows (cache leaves are [..., B, S, K, H]: scanned stacks
  add a leading layer axis)."""
  take = lambda x, axis: None if x is None else jnp.take(x, rows_R, axis=axis)
  return state.replace(
      cache=jax.tree.map(lambda x: take(x, x.ndim - 4), state.cache),
      start_B=take(state.start_B, 0), encoded_BSD=take(state.encoded_BSD, 0),
      encoder_segment_ids_BS=take(state.encoder_segment_ids_BS, 0))


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "beam_size"))
def _beam_search(model, params, tokens_BP, start_B, enc_tokens, enc_seg, eos_id, alpha, *,
                 max_new_tokens, beam_size):
  B, P = tokens_BP.shape
  W, T = beam_size, max_new_tokens
  encoded, enc_seg = _encoded(model, params, enc_tokens, enc_seg)
  logits_BPV, state = prefill(model, params, tokens_BP, start_B, P + T, encoded, enc_seg)
  # One prefill per prompt; its rows are then copied to the W beams (row b * W + w).
  state = _take_rows(state, jnp.repeat(jnp.arange(B), W))
  V = logits_BPV.shape[-1]
  neg_inf = jnp.float32(-jnp.inf)

  def expand(carry, logp_BWV, t):
    """Extend every alive beam by every token; keep the best W that did not end and merge
    the ones that did into the finished set (scored with the length penalty)."""
    alive_BWT, alive_lp_BW, fin_BWT, fin_score_BW, _ = carry
    cand_BWV = alive_lp_BW[..., None] + logp_BWV
    top_lp_BC, top_i_BC = jax.lax.top_k(cand_BWV.reshape(B, W * V), 2 * W)
    parent_BC, token_BC = top_i_BC // V, (top_i_BC % V).astype(jnp.int32)
    seq_BCT = jnp.take_along_axis(alive_BWT, parent_BC[..., None], axis=1).at[:, :, t].set(
        token_BC)
    ended_BC = token_BC == eos_id
    # Finished: merge with the previous best W.
    score_BC = jnp.where(ended_BC, top_lp_BC / length_penalty(t + 1.0, alpha), neg_inf)
    fin_score_BW, keep = jax.lax.top_k(jnp.concatenate([fin_score_BW, score_BC], 1), W)
    fin_BWT = jnp.take_along_axis(jnp.concatenate([fin_BWT, seq_BCT], 1), keep[..., None], 1)
    # Alive: the best W candidates that did not end.
    alive_lp_BW, keep = jax.lax.top_k(jnp.where(ended_BC, neg_inf, top_lp_BC), W)
    alive_BWT = jnp.take_along_axis(seq_BCT, keep[..., None], axis=1)
    parent_BW = jnp.take_along_axis(parent_BC, keep, axis=1)
    return alive_BWT, alive_lp_BW, fin_BWT, fin_score_BW, parent_BW

  def done(carry, t):
    """No alive beam can still beat the worst of the W finished: log-probs only fall, and
    with alpha >= 0 the kindest penalty is the one at the longest length."""
    _, alive_lp_BW, _, fin_score_BW, _ = carry
    best_possible_B = alive_lp_BW[:, 0] / length_penalty(jnp.float32(T), alpha)
    return (t >= T) | jnp.all(fin_score_BW[:, -1] >= best_possible_B)

  first_lp_BV = jax.nn.log_softmax(logits_BPV[:, -1].astype(jnp.float32))
  init = (jnp.full((B, W, T), PAD_ID, jnp.int32),
          jnp.concatenate([jnp.zeros((B, 1)), jnp.full((B, W - 1), -jnp.inf)], 1),  # 1 beam
          jnp.full((B, W, T), PAD_ID, jnp.int32), jnp.full((B, W), -jnp.inf),
          jnp.zeros((B, W), jnp.int32))
  carry = expand(init, jnp.broadcast_to(first_lp_BV[:, None], (B, W, V)), 0)

  def body(loop):
    t, carry, state = loop
    alive_BWT, parent_BW = carry[0], carry[4]
    # The cache follows each surviving beam's parent.
    state = _take_rows(state, (jnp.arange(B)[:, None] * W + parent_BW).reshape(-1))
    logits_RV, state = step(model, params, state, alive_BWT[:, :, t - 1].reshape(-1))
    logp_BWV = jax.nn.log_softmax(logits_RV.astype(jnp.float32)).reshape(B, W, V)
    return t + 1, expand(carry, logp_BWV, t), state

  t, carry, _ = jax.lax.while_loop(lambda loop: ~done(loop[1], loop[0]), body,
                                   (jnp.int32(1), carry, state))
  alive_BWT, alive_lp_BW, fin_BWT, fin_score_BW, _ = carry
  # Rows where nothing finished return their alive beams, scored at the length reached.
  none_B = ~jnp.isfinite(fin_score_BW[:, 0])
  tokens_BWT = jnp.where(none_B[:, None, None], alive_BWT, fin_BWT)
  scores_BW = jnp.where(none_B[:, None], alive_lp_BW / length_penalty(t.astype(jnp.float32),
                                                                      alpha), fin_score_BW)
  return tokens_BWT, scores_BW


def beam_search(model, params, prompts: Sequence[Sequence[int]] | None, *,
                max_new_tokens: int, beam_size: int, length_penalty_alpha: float = 0.6,
                eos_id: int = EOS_ID, encoder_inputs=None):
  """(tokens_BWT, scores_BW), best first, both numpy.

  A hypothesis is finished when it emits eos_id (kept, padded after); its score is
  log p(tokens) / length_penalty(number of tokens, alpha). Rows where no hypothesis finished
  within max_new_tokens return the alive beams instead. Prompts and encoder_inputs as for
  `generate`.
  """
  if not (isinstance(beam_size, (int, np.integer)) and beam_size >= 1):
    raise ValueError(f"beam_size must be an integer >= 1, got {beam_size}.")
  if not length_penalty_alpha >= 0:
    raise ValueError(f"length_penalty_alpha must be >= 0, got {length_penalty_alpha}.")
  model, tokens_BP, start_B, (enc_tokens, enc_seg) = _prepare(model, prompts, max_new_tokens,
                                                              encoder_inputs)
  tokens_BWT, scores_BW = _beam_search(
      model, params, tokens_BP, start_B, enc_tokens, enc_seg, jnp.int32(eos_id),
      jnp.float32(length_penalty_alpha), max_new_tokens=max_new_tokens, beam_size=beam_size)
  return np.asarray(tokens_BWT), np.asarray(scores_BW)
