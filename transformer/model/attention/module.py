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
from transformer.model.attention.layout import Layout
from transformer.model.attention.reference import dense, dense_weights
from transformer.model.positions import AttentionTerms


CACHE_MODES = ("", "prefill", "step")


class Attention(nn.Module):
  """Multi-head attention with K key/value heads shared by groups of N // K query heads.

  Self-attention when `kv_BSD` is None. Weights are sown to 'intermediates' when that
  collection is mutable, so a probe can read every head without hooks.

  `cache_mode` turns on the KV cache (the 'cache' collection, cached_key/cached_value
  [B, S_cache, K, H]; see decode.py for the layout that goes with it):
    "prefill"  attend as usual, then store the keys/values: self-attention those of the last
               S_cache tokens (token index i in slot i % S_cache, a ring when a window bounds
               the cache), cross-attention those of the whole encoder output.
    "step"     self-attention computes only the new tokens' keys/values, writes them at
               their slots and attends to the whole cache (the layout's keys are the slots);
               cross-attention reuses what prefill stored: the encoder output is fixed.
  """
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
      k, v = self._cache_read()
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
      self.sow("intermediates", "attention_weights",
               dense_weights(q, k, layout, terms, scale=scale))
    if cfg.attention_dropout_rate and not self.deterministic:
      # Dropout on the weights needs them materialized: only the reference can do it.
      weights = dense_weights(q, k, layout, terms, scale=scale)
      weights = nn.Dropout(cfg.attention_dropout_rate)(weights, deterministic=False)
      B, L = q.shape[:2]
      out = jnp.einsum("bkgls,bskh->blkgh",
                       weights.reshape(B, K, N // K, L, -1).astype(v.dtype), v)
      out = out.reshape(B, L, N, H)
    elif mode == "step":
      # A few new queries against the cache: the score rows are short, every exact
      # implementation reduces to the reference here.
      out = dense(q, k, v, layout, terms, scale=scale, cfg=cfg)
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

  def _require_cache(self):
    if self.cache_mode == "step" and not self.has_variable("cache", "cached_key"):
      raise ValueError("cache_mode='step' found no cache; run a prefill first "
                       "(transformer.decode.prefill).")

  def _cache_write(self, k_BLKH, v_BLKH, layout, cross):
    """Store new keys/values; return what this call attends to (see the class docstring)."""
    self._require_cache()
    # Created with the input's shape when absent: decode.init_cache traces a prefill of the
    # cache's length to learn every layer's shapes.
    ck = self.variable("cache", "cached_key", jnp.zeros, k_BLKH.shape, k_BLKH.dtype)
    cv = self.variable("cache", "cached_value", jnp.zeros, v_BLKH.shape, v_BLKH.dtype)
    S, L = ck.value.shape[1], k_BLKH.shape[1]
    if cross:
      ck.value, cv.value = k_BLKH, v_BLKH
      return k_BLKH, v_BLKH
    if self.cache_mode == "prefill":
      # Prefill attends to its own keys; the cache keeps the last S of them, token index i
      # in slot i % S (a rotation of the tail when the prompt is longer than a window ring).
      keep = functools.partial(jnp.roll, shift=L % S, axis=1) if L > S else (lambda x: x)
      put = lambda c, x: jax.lax.dynamic_update_slice_in_dim(c, keep(x[:, -S:]), 0, axis=1)
      ck.value, cv.value = put(ck.value, k_BLKH), put(cv.value, v_BLKH)
      return k_BLKH, v_BLKH
    # Left-padded batches share the indices of a step, so one set of slots serves every row.
    slots_L = layout.q_idx_BL[0] % S
    ck.value = ck.value.at[:, slots_L].set(k_BLKH)
    cv.value = cv.value.at[:, slots_L].set(v_BLKH)
    return ck.value, cv.value
