"""Approximations of softmax attention: kernelized `linear` and the block-local `block_sparse`
pattern; each is compared with its own formula in the tests, and refuses what it cannot honour."""

import jax
import jax.numpy as jnp

from transformer.model.attention.blockwise import _pad_to
from transformer.model.attention.layout import Layout
from transformer.model.attention.reference import _group, dense


def _refuse(impl, layout, terms, *, window=True, bias=True, prefix=True):
  if window and layout.window:
    raise ValueError(f"model.attention={impl!r} does not support a sliding window; use "
                     f"'dense' or 'chunked'.")
  if bias and terms.bias_table is not None:
    raise ValueError(f"model.attention={impl!r} cannot add a score bias "
                     f"({terms.bias_kind}); use 'rope'/'none' positions or 'dense'.")
  if prefix and layout.k_prefix_BS is not None:
    raise ValueError(f"model.attention={impl!r} does not support prefix-LM masks; use 'dense'.")


def linear(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """Kernelized linear attention (Katharopoulos et al. 2020), phi(x) = elu(x) + 1:
  out_i = phi(q_i) . sum_j phi(k_j) v_j^T / phi(q_i) . sum_j phi(k_j), over visible j.
  Causal rows use a running sum that restarts at each packed document; O(L) in length.
  An approximation of softmax attention, so it is compared with its own formula in tests."""
  _refuse("linear", layout, terms)
  B, L, N, H = q_BLNH.shape
  K = k_BSKH.shape[2]
  phi = lambda x: jax.nn.elu(x.astype(jnp.float32)) + 1.0
  q = _group(phi(q_BLNH), K)  # [B, L, K, G, H]
  k_valid = (layout.k_seg_BS != 0)[:, :, None, None]
  k = jnp.where(k_valid, phi(k_BSKH), 0.0)
  v = v_BSKH.astype(jnp.float32)
  kv_BSKHH = jnp.einsum("bskh,bskd->bskhd", k, v)
  if layout.causal:
    if layout.q_idx_BL.shape != layout.k_idx_BS.shape:
      raise ValueError("causal linear attention needs queries and keys of the same sequence.")
    starts = jnp.concatenate([jnp.ones((B, 1), bool),
                              layout.k_seg_BS[:, 1:] != layout.k_seg_BS[:, :-1]], axis=1)

    def combine(a, b):  # a running sum that restarts where a new segment starts
      (sa, fa), (sb, fb) = a, b
      reset = fb.reshape(fb.shape + (1,) * (sb.ndim - fb.ndim))
      return jnp.where(reset, sb, sa + sb), fa | fb

    kv_sum, _ = jax.lax.associative_scan(combine, (kv_BSKHH, starts), axis=1)
    k_sum, _ = jax.lax.associative_scan(combine, (k, starts), axis=1)
  else:
    # Sum over keys of the query's own segment: segment ids index a per-row table.
    num = L + 1
    seg_sum = jax.vmap(lambda x, s: jax.ops.segment_sum(x, s, num_segments=num))
    kv_tab = seg_sum(kv_BSKHH, layout.k_seg_BS)
    k_tab = seg_sum(k, layout.k_seg_BS)
    take = jax.vmap(lambda tab, s: tab[s])
    q_seg = jnp.clip(layout.q_seg_BL, 0, num - 1)
    kv_sum, k_sum = take(kv_tab, q_seg), take(k_tab, q_seg)
  numer = jnp.einsum("blkgh,blkhd->blkgd", q, kv_sum)
  denom = jnp.einsum("blkgh,blkh->blkg", q, k_sum)[..., None]
  out = numer / jnp.where(denom == 0, 1.0, denom)
  out = jnp.where((layout.q_seg_BL != 0)[:, :, None, None, None], out, 0.0)
  return out.reshape(B, L, N, H).astype(q_BLNH.dtype)


def block_sparse(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """Block-local sparse attention (the local pattern of Child et al. 2019 / Longformer): each
  query block of size c sees keys of its own and the previous block, on top of the usual mask.
  Work and memory are O(L * c). Exact softmax over that pattern, so tests compare it with
  dense attention under the same pattern (`block_local_mask`)."""
  B, L, N, H = q_BLNH.shape
  if k_BSKH.shape[1] != L:
    raise ValueError("block_sparse attention is for self-attention; use 'dense' or 'chunked'.")
  c = min(cfg.attention_chunk, L)
  pad = lambda x, v=0: _pad_to(x, c, 1, v)
  blocks = lambda x: x.reshape(B, -1, c, *x.shape[2:])

  def with_previous(x):  # [B, nb, c, ...] -> [B, nb, 2c, ...]
    prev = jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
    return jnp.concatenate([prev, x], axis=2)

  q = blocks(pad(q_BLNH))
  k, v = with_previous(blocks(pad(k_BSKH))), with_previous(blocks(pad(v_BSKH)))
  nb = q.shape[1]
  fold = lambda x: x.reshape(B * nb, *x.shape[2:])  # blocks become batch rows
  # The previous block of block 0 is zeros with segment 0, so it is masked out.
  q_lay = lambda x: fold(blocks(pad(x)))
  k_lay = lambda x, v=0: fold(with_previous(blocks(pad(x, v))))
  blk = layout.replace(
      q_seg_BL=q_lay(layout.q_seg_BL), q_idx_BL=q_lay(layout.q_idx_BL),
      q_pos_BL=q_lay(layout.q_pos_BL), k_seg_BS=k_lay(layout.k_seg_BS),
      k_idx_BS=k_lay(layout.k_idx_BS), k_pos_BS=k_lay(layout.k_pos_BS),
      k_prefix_BS=None if layout.k_prefix_BS is None else k_lay(layout.k_prefix_BS, False),
      index_offset=None, segments="packed")
  out = dense(fold(q), fold(k), fold(v), blk, terms, scale=scale, cfg=cfg)
  return out.reshape(B, nb * c, N, H)[:, :L]


def block_local_mask(layout: Layout, block: int) -> jax.Array:
  """The pattern block_sparse computes, as a dense [B, 1, L, S] mask (for tests)."""
  qb = layout.q_idx_BL[:, :, None] // block
  kb = layout.k_idx_BS[:, None, :] // block
  return (layout.mask()[:, 0] & ((qb == kb) | (qb == kb + 1)))[:, None]
