"""Attention: masks, projections and interchangeable implementations (a registry).

  scores_BKGLS = q . k / sqrt(H) + positional bias, masked; weights = softmax(scores); out = weights . v

Queries have N heads, keys and values K heads (N = K * G): MHA is K = N, MQA is K = 1, GQA
anything between. Every implementation takes the same arguments and must agree with `dense`
(the reference, softmax in float32) or refuse a feature it cannot honour with a clear error.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from flax import struct

from transformer import cpu_attention, projection
from transformer.positions import AttentionTerms


@struct.dataclass
class Layout:
  """Per-position facts that decide which key each query may see.

  Kept per position (not as an L x S mask) so blockwise implementations build only the
  block they need. segment 0 marks padding; tokens of different segments (documents packed
  into one row) never see each other. `idx` is the index in the sequence (causality and the
  window), `pos` the position the positional scheme sees (restarts in each packed document).
  """
  q_seg_BL: jax.Array
  k_seg_BS: jax.Array
  q_idx_BL: jax.Array
  k_idx_BS: jax.Array
  q_pos_BL: jax.Array
  k_pos_BS: jax.Array
  k_prefix_BS: jax.Array | None = None  # prefix-LM: keys every query of the segment may see
  causal: bool = struct.field(pytree_node=False, default=False)
  window: int = struct.field(pytree_node=False, default=0)
  # d = (q_idx[:, i] - i) - (k_idx[:, j] - j) for every row, i and j, where that is known at
  # trace time (make_layout and its slices): lets blockwise code skip keys no query of a
  # block can see. None: unknown (any code that builds other index arrays must say so).
  index_offset: int | None = struct.field(pytree_node=False, default=None)

  def mask(self) -> jax.Array:
    """bool [B, 1, L, S]: True where query l may attend to key s."""
    q_seg, k_seg = self.q_seg_BL[:, :, None], self.k_seg_BS[:, None, :]
    allowed = (q_seg == k_seg) & (k_seg != 0)
    offset = self.q_idx_BL[:, :, None] - self.k_idx_BS[:, None, :]
    if self.causal:
      visible = offset >= 0
      if self.k_prefix_BS is not None:
        visible |= self.k_prefix_BS[:, None, :]
      allowed &= visible
    if self.window:
      allowed &= jnp.abs(offset) < self.window
    return allowed[:, None]

  def slice(self, q: slice | None = None, k: slice | None = None) -> "Layout":
    """The layout of a block of queries and/or keys (static slices)."""
    out = self
    if q is not None:
      out = out.replace(q_seg_BL=out.q_seg_BL[:, q], q_idx_BL=out.q_idx_BL[:, q],
                        q_pos_BL=out.q_pos_BL[:, q], index_offset=_shift(out.index_offset, q))
    if k is not None:
      out = out.replace(k_seg_BS=out.k_seg_BS[:, k], k_idx_BS=out.k_idx_BS[:, k],
                        k_pos_BS=out.k_pos_BS[:, k],
                        k_prefix_BS=None if out.k_prefix_BS is None else out.k_prefix_BS[:, k],
                        index_offset=_shift(out.index_offset, k, sign=-1))
    return out

  def visible_keys(self, q_start: int, q_stop: int, k_len: int) -> tuple[int, int]:
    """A range of keys outside which no query in [q_start, q_stop) sees anything: the keys
    at or below the diagonal of a causal block, within the window of a windowed one."""
    d = self.index_offset
    if d is None or self.k_prefix_BS is not None:
      return 0, k_len
    lo, hi = 0, k_len
    if self.causal:
      hi = q_stop + d
    if self.window:
      lo = q_start + d - self.window + 1
      if not self.causal:
        hi = q_stop - 1 + d + self.window
    return min(max(lo, 0), k_len), min(max(hi, 0), k_len)


def _shift(offset, s: slice, sign=1):
  if offset is None or s.step not in (None, 1):
    return None
  return offset + sign * (s.start or 0)


def make_layout(q_len: int, k_len: int, *, batch: int, q_segments=None, k_segments=None,
                q_positions=None, k_positions=None, prefix=None, causal=False, window=0,
                q_offset=0) -> Layout:
  """A Layout with defaults: one segment, positions = indices. q_offset shifts query indices
  (a decoding step's queries sit after the cached keys)."""
  def default(x, n, fill):
    return jnp.broadcast_to(fill(n), (batch, n)) if x is None else x.astype(jnp.int32)

  q_idx = jnp.broadcast_to(jnp.arange(q_len, dtype=jnp.int32) + q_offset, (batch, q_len))
  k_idx = jnp.broadcast_to(jnp.arange(k_len, dtype=jnp.int32), (batch, k_len))
  ones = lambda n: jnp.ones((n,), jnp.int32)
  return Layout(
      q_seg_BL=default(q_segments, q_len, ones), k_seg_BS=default(k_segments, k_len, ones),
      q_idx_BL=q_idx, k_idx_BS=k_idx,
      q_pos_BL=q_idx if q_positions is None else q_positions.astype(jnp.int32),
      k_pos_BS=k_idx if k_positions is None else k_positions.astype(jnp.int32),
      k_prefix_BS=prefix, causal=causal, window=window,
      index_offset=q_offset if isinstance(q_offset, int) else None)


# ---------------------------------------------------------------------------------------------
# Implementations: fn(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg) -> out_BLNH

def _group(q_BLNH, num_kv_heads):
  B, L, N, H = q_BLNH.shape
  return q_BLNH.reshape(B, L, num_kv_heads, N // num_kv_heads, H)


def _scores(q_BLKGH, k_BSKH, layout, terms, scale):
  B, L, K, G, H = q_BLKGH.shape
  if G == 1:  # MHA: a 4-D contraction spares XLA:CPU the grouped layout's transposes
    scores = jnp.einsum("blkh,bskh->bkls", q_BLKGH[:, :, :, 0], k_BSKH,
                        preferred_element_type=jnp.float32)[:, :, None] * scale
  else:
    scores = jnp.einsum("blkgh,bskh->bkgls", q_BLKGH, k_BSKH,
                        preferred_element_type=jnp.float32) * scale
  bias_BNLS = terms.bias(layout.q_pos_BL, layout.k_pos_BS)
  if bias_BNLS is not None:
    B, K, G, L, S = scores.shape
    scores = scores + bias_BNLS.reshape(B, K, G, L, S)
  return scores


def masked_softmax(scores, mask):
  """softmax over the last axis where mask is True; rows with no allowed key give zeros.

  Masked scores become a large finite negative rather than -inf: exp() of them is exactly 0,
  nothing overflows in either pass (a masked score far above the row's maximum would,
  and where()'s zero cotangent times inf is NaN), and jax.nn.softmax's own derivative
  keeps only the output for the backward pass."""
  weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
  return jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, 0.0)


def dense_weights(q_BLNH, k_BSKH, layout, terms, *, scale):
  """Attention weights [B, N, L, S] in float32 (for the reference and for inspection)."""
  K = k_BSKH.shape[2]
  scores = _scores(_group(q_BLNH, K), k_BSKH, layout, terms, scale)
  weights = masked_softmax(scores, layout.mask()[:, :, None])
  B, K, G, L, S = weights.shape
  return weights.reshape(B, K * G, L, S)


def dense(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """The reference: the whole score matrix at once, softmax in float32."""
  B, L, N, H = q_BLNH.shape
  K = k_BSKH.shape[2]
  weights = dense_weights(q_BLNH, k_BSKH, layout, terms, scale=scale)
  if K == N:
    return jnp.einsum("bnls,bsnh->blnh", weights.astype(v_BSKH.dtype), v_BSKH)
  weights = weights.reshape(B, K, N // K, L, -1).astype(v_BSKH.dtype)
  out = jnp.einsum("bkgls,bskh->blkgh", weights, v_BSKH)
  return out.reshape(B, L, N, H)


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
      index_offset=None)
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
  S, K = k_BSKH.shape[1], k_BSKH.shape[2]
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
  contracts the rows of both (XLA:CPU's slow generic kernel, ~70 against ~200 GFLOP/s).
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


def cudnn(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """cuDNN's fused attention through jax.nn.dot_product_attention (GPU, fp16/bf16 only)."""
  if jax.default_backend() != "gpu":
    raise ValueError(f"model.attention='cudnn' needs a GPU (backend is "
                     f"{jax.default_backend()!r}); use 'auto', 'dense' or 'chunked'.")
  if q_BLNH.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f"model.attention='cudnn' needs model.dtype bfloat16 or float16, got "
                     f"{q_BLNH.dtype}; set --config.model.dtype=bfloat16 or use 'dense'.")
  mask = layout.mask()
  bias = terms.bias(layout.q_pos_BL, layout.k_pos_BS)
  out = jax.nn.dot_product_attention(
      q_BLNH, k_BSKH, v_BSKH, bias=None if bias is None else bias.astype(q_BLNH.dtype),
      mask=mask, scale=scale, implementation="cudnn")
  # Rows with no visible key: cuDNN returns an average of nothing; the contract is zeros.
  has_key = jnp.any(mask, axis=-1)[:, 0, :, None, None]
  return jnp.where(has_key, out, 0).astype(q_BLNH.dtype)


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
      index_offset=None)
  out = dense(fold(q), fold(k), fold(v), blk, terms, scale=scale, cfg=cfg)
  return out.reshape(B, nb * c, N, H)[:, :L]


def block_local_mask(layout: Layout, block: int) -> jax.Array:
  """The pattern block_sparse computes, as a dense [B, 1, L, S] mask (for tests)."""
  qb = layout.q_idx_BL[:, :, None] // block
  kb = layout.k_idx_BS[:, None, :] // block
  return (layout.mask()[:, 0] & ((qb == kb) | (qb == kb + 1)))[:, None]


def fused_cpu(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """The fused CPU kernel (transformer/cpu_attention.cc: AVX-512, float32): each tile of 64
  queries keeps its scores in cache, the backward pass recomputes them (FlashAttention-2)."""
  if (why := cpu_attention.refusal(q_BLNH, k_BSKH, layout, terms)) is not None:
    raise ValueError(f"model.attention='fused_cpu': {why}; use 'auto' or 'query_blocks'.")
  out = cpu_attention.attention(q_BLNH, k_BSKH, v_BSKH, layout, scale=scale)
  return out.astype(q_BLNH.dtype)


def auto(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """cuDNN on GPU in half precision; on CPU the fused kernel where it applies (float32, no
  score bias, window or prefix, head size a multiple of 16, at least one full tile of 64
  queries: a decoding step's single query would waste the rest of the tile; it needs AVX-512
  and a C++ compiler); otherwise chunked once the score matrix would not fit comfortably
  (64M scores per head group), query_blocks on CPU, dense elsewhere."""
  if jax.default_backend() == "gpu" and q_BLNH.dtype in (jnp.bfloat16, jnp.float16):
    return cudnn(q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale, cfg=cfg)
  if (q_BLNH.shape[1] >= cpu_attention.QUERY_TILE
      and cpu_attention.refusal(q_BLNH, k_BSKH, layout, terms) is None):
    return fused_cpu(q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale, cfg=cfg)
  if q_BLNH.shape[1] * k_BSKH.shape[1] > 8192 * 8192:
    return chunked(q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale, cfg=cfg)
  if jax.default_backend() == "cpu":
    return query_blocks(q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale, cfg=cfg)
  return dense(q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale, cfg=cfg)


IMPLEMENTATIONS = {"dense": dense, "chunked": chunked, "query_blocks": query_blocks,
                   "fused_cpu": fused_cpu, "cudnn": cudnn, "linear": linear,
                   "block_sparse": block_sparse, "auto": auto}


def get_implementation(name: str):
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"Unknown model.attention {name!r}; valid: {sorted(IMPLEMENTATIONS)}.")
  return IMPLEMENTATIONS[name]


# ---------------------------------------------------------------------------------------------

def dense_init(axes):
  return nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes)


def per_token(layer, x):
  """Apply a projection to the tokens of x [B, L, ...] flattened into one axis.

  Same parameters and result; on XLA:CPU a [B, L, D] operand makes the backward pass write
  transposed copies of the activation gradients (measured: W1 step time -31%)."""
  y = layer(x.reshape(-1, *x.shape[2:]))
  return y.reshape(*x.shape[:2], *y.shape[1:])


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
    dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    proj = functools.partial(nn.DenseGeneral, axis=-1, use_bias=cfg.use_bias, dtype=dtype,
                             param_dtype=pdtype, dot_general=projection.dot_general)
    q = per_token(proj((N, H), kernel_init=dense_init(("embed", "heads", "head_dim")),
                       bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                              ("heads", "head_dim")),
                       name="query"), x_BLD)
    q = terms.rotate(q, layout.q_pos_BL)
    if mode == "step" and kv_BSD is not None:
      k, v = self._cache_read()
    else:
      kv_in = x_BLD if kv_BSD is None else kv_BSD
      kv_bias = nn.with_logical_partitioning(nn.initializers.zeros, ("kv_heads", "head_dim"))
      k = per_token(proj((K, H), kernel_init=dense_init(("embed", "kv_heads", "head_dim")),
                         bias_init=kv_bias, name="key"), kv_in)
      v = per_token(proj((K, H), kernel_init=dense_init(("embed", "kv_heads", "head_dim")),
                         bias_init=kv_bias, name="value"), kv_in)
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
    return per_token(nn.DenseGeneral(
        cfg.d_model, axis=(-2, -1), use_bias=cfg.use_bias, dtype=dtype, param_dtype=pdtype,
        dot_general=projection.dot_general,
        kernel_init=dense_init(("heads", "head_dim", "embed")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        name="out"), out)

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
