"""The Attention module: projections, positional terms, the KV cache for decoding, and the
call into the implementation `model.attention` names."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from transformer.model.dense import Dense, constrain
from transformer.model.attention import get_implementation
from transformer.model.attention.cached import (as_values, cached, from_blocks, held_dtype,
                                                to_blocks, to_held, write_slot)
from transformer.model.attention.layout import Layout
from transformer.model.attention.reference import dense_weights
from transformer.model.positions import AttentionTerms


CACHE_MODES = ("", "prefill", "step")


class Attention(nn.Module):
  """Multi-head attention with K key/value heads shared by groups of N // K query heads.

  Self-attention when `kv_BSD` is None. Weights are sown to 'intermediates' when that
  collection is mutable, so a probe can read every head without hooks.

  `cache_mode` turns on the KV cache (the 'cache' collection, cached_key/cached_value, each
  a tuple of blocks [B, K, b_j, H] along the S_cache slots: cached.py says why; see
  decode.py for the layout that goes with it):
    "prefill"  attend as usual, then store the keys/values: self-attention those of the last
               S_cache tokens (token index i in slot i % S_cache, a ring when a window bounds
               the cache), cross-attention those of the whole encoder output.
    "step"     self-attention computes only the new tokens' keys/values, writes them at
               their slots and attends to the slots filled so far (the layout's keys are the
               slots; cached.py reads a prefix of the cache that covers them, so a step
               costs what is filled, not what is allocated); cross-attention reuses what
               prefill stored: the encoder output is fixed.
  The cache holds model.cache_dtype ("" = the keys' own dtype)."""
  cfg: ml_collections.ConfigDict
  deterministic: bool = True
  cache_mode: str = ""

  @nn.compact
  def __call__(self, x_BLD, layout: Layout, terms: AttentionTerms, kv_BSD=None):
    cfg, mode = self.cfg, self.cache_mode
    if mode not in CACHE_MODES:
      raise ValueError(f"Unknown cache_mode {mode!r}; valid: {CACHE_MODES}.")
    N, H = cfg.num_heads, cfg.head_dim or cfg.d_model // cfg.num_heads
    K = cfg.num_kv_heads or N
    q = Dense((N, H), ("embed", "heads", "head_dim"), cfg=cfg, name="query")(x_BLD)
    q = terms.rotate(q, layout.q_pos_BL)
    if mode == "step" and kv_BSD is not None:
      k, v = (as_values(c, self._cache_dtype(x_BLD.dtype)) for c in self._cache_read())
    else:
      kv_in = x_BLD if kv_BSD is None else kv_BSD
      k = Dense((K, H), ("embed", "kv_heads", "head_dim"), cfg=cfg, name="key")(kv_in)
      v = Dense((K, H), ("embed", "kv_heads", "head_dim"), cfg=cfg, name="value")(kv_in)
      # Each key is rotated once, by its own position; at a step that is the new token's,
      # since the layout's keys then describe the cache slots.
      k = terms.rotate(k, layout.q_pos_BL if mode == "step" else layout.k_pos_BS)
      if mode:
        k, v = self._cache_write(k, v, layout, cross=kv_BSD is not None)
    scale = cfg.qk_scale or 1.0 / math.sqrt(H)

    if self.is_mutable_collection("intermediates"):
      # A step's k is the cache's blocks [B, K, b_j, H]; the reference takes [B, S, K, H].
      k_BSKH = jnp.swapaxes(from_blocks(k), 1, 2) if mode == "step" else k
      self.sow("intermediates", "attention_weights",
               dense_weights(q, k_BSKH, layout, terms, scale=scale))
    if mode == "step":
      # The new queries over the cache's filled slots only (all of a cross-attention cache).
      # The CPU kernel where training would use the fused one (auto, fused_cpu).
      out = cached(q, k, v, layout, terms, scale=scale,
                   filled=None if kv_BSD is None else k[0].shape[2],
                   kernel=cfg.attention in ("auto", "fused_cpu"))
    elif cfg.attention_dropout_rate and not self.deterministic:
      # Dropout on the weights needs them materialized: only the reference can do it.
      weights = dense_weights(q, k, layout, terms, scale=scale)
      weights = nn.Dropout(cfg.attention_dropout_rate)(weights, deterministic=False)
      B, L = q.shape[:2]
      out = jnp.einsum("bkgls,bskh->blkgh",
                       weights.reshape(B, K, N // K, L, -1).astype(v.dtype), v)
      out = out.reshape(B, L, N, H)
    else:
      out = get_implementation(cfg.attention)(q, k, v, layout, terms, scale=scale, cfg=cfg)
    # Each tensor device keeps its own heads' output (q, k and v came split by head from
    # Dense); the out projection sums over the heads.
    out = constrain(out, ("batch", "length", "heads", "head_dim"))
    return Dense(cfg.d_model, ("heads", "head_dim", "embed"), axis=(-2, -1), cfg=cfg,
                 name="out")(out)

  def _cache_read(self):
    self._require_cache()
    return self.get_variable("cache", "cached_key"), self.get_variable("cache", "cached_value")

  def _cache_dtype(self, compute_dtype):
    """model.cache_dtype ("" = the compute dtype; older configs lack the key)."""
    return jnp.dtype(self.cfg.get("cache_dtype") or compute_dtype)

  def _require_cache(self):
    if self.cache_mode == "step" and not self.has_variable("cache", "cached_key"):
      raise ValueError("cache_mode='step' found no cache; run a prefill first "
                       "(transformer.decode.prefill).")

  def _cache_write(self, k_BLKH, v_BLKH, layout, cross):
    """Store new keys/values; return what this call attends to (see the class docstring):
    at prefill its own keys/values [B, L, K, H], at a step the cache's blocks."""
    self._require_cache()
    # Created with the input's shape when absent: decode.init_cache traces a prefill of the
    # cache's length to learn every layer's shapes.
    B, L, K, H = k_BLKH.shape
    # model.cache_dtype may store keys and values narrower than they are computed (half the
    # cache's memory and of what a step reads in bfloat16); each is rounded once, as stored.
    dtype = self._cache_dtype(k_BLKH.dtype)
    blocks = lambda: to_blocks(jnp.zeros((B, K, L, H), held_dtype(dtype)))
    ck = self.variable("cache", "cached_key", blocks)
    cv = self.variable("cache", "cached_value", blocks)
    S = sum(c.shape[2] for c in ck.value)
    heads_first = lambda x: to_held(jnp.swapaxes(x, 1, 2), dtype)
    if cross:  # the encoder output, read whole at every step: one block
      ck.value, cv.value = (heads_first(k_BLKH),), (heads_first(v_BLKH),)
      return k_BLKH, v_BLKH
    if self.cache_mode == "prefill":
      # Prefill attends to its own keys; the cache keeps the last S of them, token index i
      # in slot i % S (a rotation of the tail when the prompt is longer than a window ring).
      keep = functools.partial(jnp.roll, shift=L % S, axis=1) if L > S else (lambda x: x)
      put = lambda c, x: to_blocks(jax.lax.dynamic_update_slice_in_dim(
          from_blocks(c), heads_first(keep(x[:, -S:])), 0, axis=2))
      ck.value, cv.value = put(ck.value, k_BLKH), put(cv.value, v_BLKH)
      return k_BLKH, v_BLKH
    # Left-padded batches share the indices of a step, so one set of slots serves every row.
    if L == 1:  # the decode loop's case: an in-place one-slot update
      put = lambda c, x: write_slot(c, heads_first(x), layout.q_idx_BL[0, 0] % S)
    else:  # a few tokens may wrap around a window ring (this rebuilds the blocks)
      put = lambda c, x: to_blocks(from_blocks(c).at[:, :, layout.q_idx_BL[0] % S].set(
          heads_first(x)))
    ck.value, cv.value = put(ck.value, k_BLKH), put(cv.value, v_BLKH)
    return as_values(ck.value, dtype), as_values(cv.value, dtype)
