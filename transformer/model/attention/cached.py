"""Attention of a decoding step over the filled part of a KV cache.

The cache is allocated for the whole generation (or the window ring), but at token index i
only slots 0 .. i hold anything: attending over all S_cache slots would make every step pay
for the final length. `cached` attends over a prefix of the cache instead: the shortest of a
few static lengths (`prefix_lengths`: multiples of `block` growing by about sqrt(2), then
S_cache) that covers the filled slots, chosen by lax.switch. So one compiled step serves
every fill level, a step reads at most ~1.4x (at least `block`) the slots it needs, and each
branch is plain dense attention over a static slice, which XLA:CPU runs at the speed of
reading the keys and values (a lax.fori_loop over dynamic key blocks with an online softmax
measured 2-3x slower per slot here: each block pays a dynamic-slice copy and a dozen small
ops). Softmax is float32, as in the reference (`dense`), which it equals up to rounding.

The cache is stored heads first, [B, K, S_cache, H]: each head's slots are contiguous, and
both contractions read a prefix in place (with [B, S, K, H] XLA:CPU transposes the whole
cache before each dot).
"""

import math

import jax
import jax.numpy as jnp

from transformer.model.attention.layout import Layout
from transformer.model.attention.reference import masked_softmax

BLOCK = 256  # the shortest prefix, and the unit prefixes are rounded up to


def prefix_lengths(slots: int, block: int = BLOCK) -> tuple[int, ...]:
  """The static prefix lengths a step may attend over: block * 2^(i/2) rounded up to a
  multiple of block while shorter than the cache, then the whole cache."""
  lengths, i = [], 0
  while (n := math.ceil(block * 2 ** (i / 2) / block) * block) < slots:
    if n not in lengths:
      lengths.append(n)
    i += 1
  return tuple(lengths) + (slots,)


def filled_slots(layout: Layout, slots: int) -> jax.Array:
  """Slots written once the step's queries are stored: up to the last query's index, at most
  all of them (a full ring). Left-padded rows share indices, so row 0 speaks for all."""
  return jnp.minimum(layout.q_idx_BL[0, -1] + 1, slots)


def _prefix(q_BKXH, k_BKSH, v_BKSH, layout: Layout, terms, scale, n: int):
  """Dense attention of the grouped queries over the first n slots: out [B, K, X, H]."""
  B, K, X, H = q_BKXH.shape
  L = layout.q_idx_BL.shape[1]
  lay = layout.slice(k=slice(0, n))
  k_BKnH, v_BKnH = k_BKSH[:, :, :n], v_BKSH[:, :, :n]
  scores_BKXn = jnp.einsum("bkxh,bknh->bkxn", q_BKXH, k_BKnH,
                           preferred_element_type=jnp.float32) * scale
  bias_BNLn = terms.bias(lay.q_pos_BL, lay.k_pos_BS)
  if bias_BNLn is not None:
    scores_BKXn = scores_BKXn + bias_BNLn.reshape(B, K, X, n)
  mask_B11Ln = lay.mask()[:, :, None]
  weights_BKGLn = masked_softmax(scores_BKXn.reshape(B, K, X // L, L, n), mask_B11Ln)
  return jnp.einsum("bkxn,bknh->bkxh", weights_BKGLn.reshape(B, K, X, n).astype(v_BKSH.dtype),
                    v_BKnH)


def cached(q_BLNH, k_BKSH, v_BKSH, layout: Layout, terms, *, scale, filled=None,
           block: int = BLOCK):
  """out_BLNH of the queries over the first `filled` slots of a cache [B, K, S_cache, H].

  `filled` defaults to what the layout's queries have written (filled_slots): the layout's
  keys describe the cache slots (decode.step_layout). Slots past the chosen prefix are never
  read; filled slots the layout masks (padding, outside the window) are read and masked."""
  B, L, N, H = q_BLNH.shape
  K, S = k_BKSH.shape[1], k_BKSH.shape[2]
  G = N // K
  # Queries grouped by their key/value head: [B, K, G * L, H], one contraction per head.
  q_BKXH = jnp.transpose(q_BLNH.reshape(B, L, K, G, H), (0, 2, 3, 1, 4)).reshape(B, K, G * L, H)
  lengths = prefix_lengths(S, block)
  if filled is None:
    filled = filled_slots(layout, S)
  branches = [lambda q, k, v, lay, n=n: _prefix(q, k, v, lay, terms, scale, n) for n in lengths]
  if isinstance(filled, int):
    which = next(i for i, n in enumerate(lengths) if n >= filled)
    out_BKXH = branches[which](q_BKXH, k_BKSH, v_BKSH, layout)
  else:
    which = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), filled)  # first n >= filled
    out_BKXH = jax.lax.switch(which, branches, q_BKXH, k_BKSH, v_BKSH, layout)
  out_BLNH = jnp.transpose(out_BKXH.reshape(B, K, G, L, H), (0, 3, 1, 2, 4)).reshape(B, L, N, H)
  return out_BLNH.astype(v_BKSH.dtype)
