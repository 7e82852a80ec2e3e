"""Attention of a decoding step over the filled part of a KV cache.

The cache is allocated for the whole generation (or the window ring), but at token index i
only slots 0 .. i hold anything: attending over all S_cache slots would make every step pay
for the final length. `cached` walks the cache in key blocks of `block` slots, up to the last
filled one, with an online (streaming) softmax:

  m = max score so far, l = sum exp(score - m), acc = sum exp(score - m) v
  per block: m' = max(m, block max); rescale l and acc by exp(m - m'); add the block's terms
  out = acc / l

The trip count ceil(filled / block) is a traced value (a lax.while_loop), so one compiled
step serves every fill level and a step's cost follows the filled length. Softmax statistics
are float32, as in the reference (`dense`), which it equals up to float rounding.

The cache is stored heads first, [B, K, S_cache, H]: a block is then K contiguous runs of
slots, and both contractions read it in place (with [B, S, K, H] XLA:CPU transposes every
block, or the whole cache, before each dot).
"""

import jax
import jax.numpy as jnp

from transformer.model.attention.layout import Layout

BLOCK = 256  # slots per key block: big enough that each block is a few large contractions
NEG = -1e30  # a masked score (finite: exp() of it is exactly 0 and nothing overflows)


def filled_slots(layout: Layout, slots: int) -> jax.Array:
  """Slots written once the step's queries are stored: up to the last query's index, at most
  all of them (a full ring). Left-padded rows share indices, so row 0 speaks for all."""
  return jnp.minimum(layout.q_idx_BL[0, -1] + 1, slots)


def _block_layout(layout: Layout, start, size: int) -> Layout:
  take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, size, axis=1)
  return layout.replace(k_seg_BS=take(layout.k_seg_BS), k_idx_BS=take(layout.k_idx_BS),
                        k_pos_BS=take(layout.k_pos_BS),
                        k_prefix_BS=None if layout.k_prefix_BS is None
                        else take(layout.k_prefix_BS),
                        index_offset=None)


def cached(q_BLNH, k_BKSH, v_BKSH, layout: Layout, terms, *, scale, filled=None,
           block: int = BLOCK):
  """out_BLNH of the queries over the first `filled` slots of a cache [B, K, S_cache, H].

  `filled` defaults to what the layout's queries have written (filled_slots): the layout's
  keys describe the cache slots (decode.step_layout), and slots past the filled ones are
  never read. A filled slot the layout masks (padding, outside the window) costs its share
  of a block like any other."""
  B, L, N, H = q_BLNH.shape
  K, S = k_BKSH.shape[1], k_BKSH.shape[2]
  G = N // K
  C = min(block, S)
  # Queries grouped by their key/value head: [B, K, G * L, H], one contraction per head.
  q_BKXH = jnp.transpose(q_BLNH.reshape(B, L, K, G, H), (0, 2, 3, 1, 4)).reshape(B, K, G * L, H)
  if filled is None:
    filled = filled_slots(layout, S)
  n_blocks = (filled + C - 1) // C

  def body(b, carry):
    m_BKX, l_BKX, acc_BKXH = carry
    # The last block of a cache that is not a multiple of C is shifted back to end at S; the
    # slots it shares with the block before are masked out here (already counted there).
    first = b * C
    start = jnp.minimum(first, S - C)
    k_BKCH = jax.lax.dynamic_slice_in_dim(k_BKSH, start, C, axis=2)
    v_BKCH = jax.lax.dynamic_slice_in_dim(v_BKSH, start, C, axis=2)
    lay = _block_layout(layout, start, C)
    scores_BKXC = jnp.einsum("bkxh,bkch->bkxc", q_BKXH, k_BKCH,
                             preferred_element_type=jnp.float32) * scale
    bias_BNLC = terms.bias(lay.q_pos_BL, lay.k_pos_BS)
    if bias_BNLC is not None:
      scores_BKXC = scores_BKXC + bias_BNLC.reshape(B, K, G * L, C)
    mask_B1LC = lay.mask() & ((start + jnp.arange(C)) >= first)
    mask_B1XC = jnp.broadcast_to(mask_B1LC[:, :, None], (B, 1, G, L, C)).reshape(B, 1, G * L, C)
    scores_BKXC = jnp.where(mask_B1XC, scores_BKXC, NEG)
    m_new = jnp.maximum(m_BKX, jnp.max(scores_BKXC, axis=-1))
    # A row with nothing visible yet keeps m = NEG; the mask keeps its exp(0) terms out.
    p_BKXC = jnp.where(mask_B1XC, jnp.exp(scores_BKXC - m_new[..., None]), 0.0)
    alpha_BKX = jnp.exp(m_BKX - m_new)
    pv_BKXH = jnp.einsum("bkxc,bkch->bkxh", p_BKXC.astype(v_BKSH.dtype), v_BKCH,
                         preferred_element_type=jnp.float32)
    return (m_new, l_BKX * alpha_BKX + jnp.sum(p_BKXC, axis=-1),
            acc_BKXH * alpha_BKX[..., None] + pv_BKXH)

  init = (jnp.full((B, K, G * L), NEG, jnp.float32), jnp.zeros((B, K, G * L), jnp.float32),
          jnp.zeros((B, K, G * L, H), jnp.float32))
  _, l_BKX, acc_BKXH = jax.lax.fori_loop(0, n_blocks, body, init)
  # Rows that saw no key give zeros, like the reference's masked_softmax.
  out_BKXH = jnp.where(l_BKX[..., None] > 0, acc_BKXH / jnp.maximum(l_BKX, 1e-30)[..., None],
                       0.0)
  out_BLNH = jnp.transpose(out_BKXH.reshape(B, K, G, L, H), (0, 3, 1, 2, 4)).reshape(B, L, N, H)
  return out_BLNH.astype(v_BKSH.dtype)
