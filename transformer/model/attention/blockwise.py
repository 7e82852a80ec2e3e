"""Exact blockwise attention in XLA: `chunked` (queries and keys in chunks with a running
softmax, O(L) memory) and `query_blocks` (blocks of queries that skip keys they cannot see,
with one hand-written backward over all blocks)."""

import functools

import jax
import jax.numpy as jnp

from transformer.cpu import projection
from transformer.model.attention.reference import _scores, masked_softmax


def _pad_to(x, multiple, axis, value=0):
  pad = -x.shape[axis] % multiple
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths, constant_values=value)


def chunked(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """Exact attention in blocks with an online softmax (Rabe & Staats 2021; FlashAttention's
  arithmetic): memory grows with L * chunk instead of L * S. Each key-block step is
  rematerialized so the backward pass keeps the same bound."""
  B, L, N, H = q_BLNH.shape
  S, K = k_BSKH.shape[1], k_BSKH.shape[2]
  c = min(cfg.attention_chunk, max(L, S))
  # Padded keys get segment 0 (masked); padded queries are dropped at the end.
  pad = lambda x, v=0: _pad_to(x, c, 1, v)
  q, k, v = pad(q_BLNH), pad(k_BSKH), pad(v_BSKH)
  lay = layout.replace(
      q_seg_BL=pad(layout.q_seg_BL), q_idx_BL=pad(layout.q_idx_BL),
      q_pos_BL=pad(layout.q_pos_BL), k_seg_BS=pad(layout.k_seg_BS),
      k_idx_BS=pad(layout.k_idx_BS), k_pos_BS=pad(layout.k_pos_BS),
      k_prefix_BS=None if layout.k_prefix_BS is None else pad(layout.k_prefix_BS, False),
      index_offset=None, segments="packed")
  blocks = lambda x: jnp.moveaxis(x.reshape(B, -1, c, *x.shape[2:]), 1, 0)
  kv_blocks = (blocks(k), blocks(v), blocks(lay.k_seg_BS), blocks(lay.k_idx_BS),
               blocks(lay.k_pos_BS),
               None if lay.k_prefix_BS is None else blocks(lay.k_prefix_BS))

  def one_query_block(args):
    q_c, q_seg, q_idx, q_pos = args
    G = N // K
    q_c = q_c.reshape(B, c, K, G, H)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def step(carry, kv):
      m, l, acc = carry
      k_c, v_c, k_seg, k_idx, k_pos, k_pre = kv
      blk = lay.replace(q_seg_BL=q_seg, q_idx_BL=q_idx, q_pos_BL=q_pos, k_seg_BS=k_seg,
                        k_idx_BS=k_idx, k_pos_BS=k_pos, k_prefix_BS=k_pre)
      s = _scores(q_c, k_c, blk, terms, scale)
      mask = blk.mask()[:, :, None]
      m_new = jnp.maximum(m, jnp.max(jnp.where(mask, s, -jnp.inf), axis=-1))
      m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      p = jnp.where(mask, jnp.exp(jnp.where(mask, s - m_safe[..., None], 0.0)), 0.0)
      correction = jnp.exp(m - m_safe)  # exp(-inf) = 0 drops a still-empty accumulator
      l = l * correction + jnp.sum(p, axis=-1)
      acc = acc * correction[..., None] + jnp.einsum(
          "bkgls,bskh->bkglh", p.astype(v_c.dtype), v_c, preferred_element_type=jnp.float32)
      return (m_new, l, acc), None

    init = (jnp.full((B, K, G, c), -jnp.inf, jnp.float32), jnp.zeros((B, K, G, c), jnp.float32),
            jnp.zeros((B, K, G, c, H), jnp.float32))
    (m, l, acc), _ = jax.lax.scan(step, init, kv_blocks)
    out = acc / jnp.where(l == 0, 1.0, l)[..., None]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, c, N, H).astype(q_BLNH.dtype)

  q_blocks = (blocks(q), blocks(lay.q_seg_BL), blocks(lay.q_idx_BL), blocks(lay.q_pos_BL))
  out = jax.lax.map(one_query_block, q_blocks)  # [nq, B, c, N, H]
  return jnp.moveaxis(out, 0, 1).reshape(B, -1, N, H)[:, :L]


_MAX_QUERY_BLOCKS = 16


def query_blocks(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """Exact attention a block of queries at a time, over only the keys the block can see
  (for a causal mask the blocks on and below the diagonal: about half the work), with a
  hand-written backward pass. The fastest exact implementation in XLA's own ops on CPU (the
  skipped keys are real savings, and every product is a plain batched matmul), and auto's
  CPU fallback where the fused kernel does not apply."""
  B, L, N, H = q_BLNH.shape
  S, K = k_BSKH.shape[1], k_BSKH.shape[2]
  G = N // K
  # Every block is its own code: at most 16 of them keeps compilation short (64 blocks took
  # 10 s per layer at L = 8192) and still skips 15/32 of a causal score matrix.
  c = min(max(cfg.attention_query_block, -(-L // _MAX_QUERY_BLOCKS)), L)
  spans, biases, masks = [], [], []
  for start in range(0, L, c):
    stop = min(start + c, L)
    lo, hi = layout.visible_keys(start, stop, S)
    spans.append((start, stop, lo, hi))
    if lo == hi:  # no query of the block sees any key: zeros, as the contract says
      biases.append(None)
      masks.append(None)
      continue
    blk = layout.slice(q=slice(start, stop), k=slice(lo, hi))
    M, E = G * (stop - start), hi - lo
    bias = terms.bias(blk.q_pos_BL, blk.k_pos_BS)
    biases.append(None if bias is None else bias.reshape(B, K, M, E))
    mask = jnp.broadcast_to(blk.mask()[:, :, None], (B, 1, G, stop - start, E))
    masks.append(mask.reshape(B, 1, M, E))
  return _query_blocks(q_BLNH, k_BSKH, v_BSKH, tuple(biases), tuple(masks), tuple(spans), scale)


# The blocks work head-major ([B, K, G, L, H]: a block's queries of one head group are M =
# G * c contiguous rows, so each product is a plain batched matmul).
_heads_major = lambda x_BLKGH: jnp.transpose(x_BLKGH, (0, 2, 3, 1, 4))
_tokens_major = lambda x_BKGLH: jnp.transpose(x_BKGLH, (0, 3, 1, 2, 4))
# The barrier keeps XLA from folding the transpose into the product that consumes it.
_rows_last = lambda x_BKMH: jax.lax.optimization_barrier(jnp.swapaxes(x_BKMH, 2, 3))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _query_blocks(q_BLNH, k_BSKH, v_BSKH, biases, masks, spans, scale):
  return _query_blocks_fwd(q_BLNH, k_BSKH, v_BSKH, biases, masks, spans, scale)[0]


def _query_blocks_fwd(q_BLNH, k_BSKH, v_BSKH, biases, masks, spans, scale):
  B, L, N, H = q_BLNH.shape
  K = k_BSKH.shape[2]
  G = N // K
  q = _heads_major(q_BLNH.reshape(B, L, K, G, H))
  k, v = (_heads_major(x[:, :, :, None])[:, :, 0] for x in (k_BSKH, v_BSKH))  # [B, K, S, H]
  outs, probs = [], []
  for (start, stop, lo, hi), bias, mask in zip(spans, biases, masks):
    if lo == hi:
      outs.append(jnp.zeros((B, K, G, stop - start, H), q.dtype))
      probs.append(None)
      continue
    q_BKMH = q[:, :, :, start:stop].reshape(B, K, -1, H)
    scores = jnp.einsum("bkmh,bksh->bkms", q_BKMH, k[:, :, lo:hi],
                        preferred_element_type=jnp.float32) * scale
    if bias is not None:
      scores = scores + bias
    p_BKMS = masked_softmax(scores, mask)
    out = jnp.einsum("bkms,bksh->bkmh", p_BKMS.astype(v.dtype), v[:, :, lo:hi])
    outs.append(out.reshape(B, K, G, stop - start, H))
    probs.append(p_BKMS)
  out_BKGLH = jnp.concatenate(outs, axis=3)
  out = _tokens_major(out_BKGLH).reshape(B, L, N, H)
  has_bias = tuple(b is not None for b in biases)
  return out, (q, k, v, tuple(probs), out_BKGLH, has_bias)


def _query_blocks_bwd(spans, scale, saved, dout_BLNH):
  """The softmax backward in one pass (FlashAttention's form): d scores = p * (dp - delta)
  with delta = rowsum(dout * out), instead of autodiff's chain through where/max/exp/sum.

  The key and value gradients are made transposed, [B, K, H, S]: dk^T = q^T ds and dv^T =
  dout^T p are plain products once q and dout are copied transposed, where dk = ds^T q
  contracts the rows of both (XLA:CPU's slow generic kernel; docs/performance.md).
  The blocks' parts add up in that layout, and one copy per tensor puts it token-major.
  The gradients' final copies are projection.transpose (plain copies of materialized
  arrays): XLA:CPU would otherwise fuse the blocks' sums into a slow transposing loop. Only
  there: each of those conditionals costs the blocks some of their parallelism on a
  multi-core device (the layer alone, 2 cores: 63 ms with these three, 72 with all layout
  changes so)."""
  q, k, v, probs, out, has_bias = saved
  B, K, G, L, H = q.shape
  S = k.shape[2]
  f32 = jnp.float32
  dout = _heads_major(dout_BLNH.reshape(B, L, K, G, H))
  delta_BKGL = jnp.sum(dout.astype(f32) * out.astype(f32), axis=-1)
  dqs, dbiases = [], []
  dkT_BKHS = dvT_BKHS = jnp.zeros((B, K, H, S), f32)
  for (start, stop, lo, hi), p, bias_grad in zip(spans, probs, has_bias):
    if lo == hi:
      dqs.append(jnp.zeros((B, K, G, stop - start, H), q.dtype))
      dbiases.append(None)
      continue
    q_BKMH = q[:, :, :, start:stop].reshape(B, K, -1, H)
    dout_BKMH = dout[:, :, :, start:stop].reshape(B, K, -1, H)
    delta = delta_BKGL[:, :, :, start:stop].reshape(B, K, -1, 1)
    dp = jnp.einsum("bkmh,bksh->bkms", dout_BKMH, v[:, :, lo:hi], preferred_element_type=f32)
    dscores = p * (dp - delta)
    ds = (dscores * scale).astype(q.dtype)
    dq = jnp.einsum("bkms,bksh->bkmh", ds, k[:, :, lo:hi]).astype(q.dtype)
    dqs.append(dq.reshape(B, K, G, stop - start, H))
    dkT_BKHS = dkT_BKHS.at[..., lo:hi].add(
        jnp.einsum("bkhm,bkms->bkhs", _rows_last(q_BKMH), ds, preferred_element_type=f32))
    dvT_BKHS = dvT_BKHS.at[..., lo:hi].add(
        jnp.einsum("bkhm,bkms->bkhs", _rows_last(dout_BKMH), p.astype(v.dtype),
                   preferred_element_type=f32))
    dbiases.append(dscores if bias_grad else None)
  dq = jnp.concatenate(dqs, axis=3)
  dq_BLNH = projection.transpose(dq, (0, 3, 1, 2, 4)).reshape(B, L, K * G, H)
  # [B, K, H, S] -> [B, S, K, H] in one copy.
  dk_BSKH, dv_BSKH = (projection.transpose(x, (0, 3, 1, 2)).astype(k.dtype)
                      for x in (dkT_BKHS, dvT_BKHS))
  return dq_BLNH, dk_BSKH, dv_BSKH, tuple(dbiases), tuple(None for _ in spans)


_query_blocks.defvjp(_query_blocks_fwd, _query_blocks_bwd)
