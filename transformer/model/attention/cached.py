"""Attention of a decoding step over the filled part of a KV cache held in blocks.

The cache is allocated for the whole generation (or the window ring), but at token index i
only slots 0 .. i hold anything: attending over all S_cache slots would make every step pay
for the final length. `cached` attends over a prefix of the cache instead: the shortest of a
few static lengths (`prefix_lengths`: multiples of `block` growing by about sqrt(2), then
S_cache) that covers the filled slots, chosen by lax.switch. So one compiled step serves
every fill level, a step reads at most ~1.4x (at least `block`) the slots it needs, and each
branch is plain dense attention, which XLA:CPU runs at the speed of reading the keys and
values. Softmax is float32, as in the reference (`dense`), which it equals up to rounding.

Each layer's cache is a tuple of blocks [B, K, b_j, H] whose sizes are the differences of
the prefix lengths (`block_sizes`), so a prefix is a number of whole blocks. That is what
makes a prefix free to read: a slice of one [B, K, S_cache, H] array is strided across rows
and heads, and XLA:CPU copies it before each dot (those copies took longer than the dots),
while a block is its own buffer, which the dot reads in place. Heads come first in a block
so that each head's slots are contiguous (with [B, S, K, H] XLA:CPU transposes before each
dot). A step writes its slot into the one block that holds it (`write_slot`), in place.
"""

import itertools
import math

import jax
import jax.numpy as jnp

from transformer.cpu import cached_attention
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


def block_sizes(slots: int, block: int = BLOCK) -> tuple[int, ...]:
  """The sizes of a cache's blocks: block j ends at prefix_lengths(slots, block)[j]."""
  lengths = prefix_lengths(slots, block)
  return tuple(b - a for a, b in zip((0,) + lengths[:-1], lengths))


def to_blocks(x_BKSH, block: int = BLOCK) -> tuple[jax.Array, ...]:
  """A cache [B, K, S, H] (or stacked [..., B, K, S, H]) as its blocks along the slots."""
  cuts = list(itertools.accumulate(block_sizes(x_BKSH.shape[-2], block)))[:-1]
  return tuple(jnp.split(x_BKSH, cuts, axis=-2))


def from_blocks(blocks) -> jax.Array:
  return blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks, axis=-2)


def write_slot(blocks, x_BK1H, slot) -> tuple[jax.Array, ...]:
  """The blocks with slot `slot` (traced) set to x_BK1H (as the blocks hold it: to_held).
  Every block takes an in-place one-slot update: the new value in the block that holds the
  slot, its old value elsewhere (a switch over blocks would pass every buffer through a
  conditional)."""
  out, start = [], 0
  for c in blocks:
    n = c.shape[2]
    local = jnp.clip(slot - start, 0, n - 1)
    old = jax.lax.dynamic_slice_in_dim(c, local, 1, axis=2)
    new = jnp.where((slot >= start) & (slot < start + n), x_BK1H.astype(c.dtype), old)
    out.append(jax.lax.dynamic_update_slice_in_dim(c, new, local, axis=2))
    start += n
  return tuple(out)


def held_dtype(dtype) -> jnp.dtype:
  """What a cache of `dtype` holds. On XLA:CPU a 16-bit float cache holds its bits (uint16):
  XLA:CPU computes 16-bit float slices, selects and updates in float32, which turns the
  in-place one-slot update of a bfloat16 block into a conversion of the whole block at every
  step (the cost of the final length again); on its bits the update stays in place."""
  dtype = jnp.dtype(dtype)
  return jnp.dtype(jnp.uint16) if dtype.itemsize == 2 and jax.default_backend() == "cpu" \
      else dtype


def to_held(x, dtype) -> jax.Array:
  """Values for a cache of `dtype`, as it holds them (held_dtype)."""
  x = x.astype(dtype)
  held = held_dtype(dtype)
  return x if held == x.dtype else jax.lax.bitcast_convert_type(x, held)


def as_values(blocks, dtype) -> tuple[jax.Array, ...]:
  """A cache's blocks as values of `dtype` (the inverse of to_held; free, a bitcast)."""
  return tuple(b if b.dtype == dtype else jax.lax.bitcast_convert_type(b, dtype)
               for b in blocks)


def filled_slots(layout: Layout, slots: int) -> jax.Array:
  """Slots written once the step's queries are stored: up to the last query's index, at most
  all of them (a full ring). Left-padded rows share indices, so row 0 speaks for all."""
  return jnp.minimum(layout.q_idx_BL[0, -1] + 1, slots)


def _prefix(q_BKXH, k_blocks, v_blocks, layout: Layout, terms, scale):
  """Dense attention of the grouped queries over the slots of the given blocks (n in all):
  out [B, K, X, H]. One pair of dots per block, each reading its block in place."""
  B, K, X, H = q_BKXH.shape
  L = layout.q_idx_BL.shape[1]
  sizes = [kb.shape[2] for kb in k_blocks]
  n = sum(sizes)
  lay = layout.slice(k=slice(0, n))
  scores_BKXn = jnp.concatenate(
      [jnp.einsum("bkxh,bknh->bkxn", q_BKXH, kb, preferred_element_type=jnp.float32)
       for kb in k_blocks], axis=-1) * scale
  bias_BNLn = terms.bias(lay.q_pos_BL, lay.k_pos_BS)
  if bias_BNLn is not None:
    scores_BKXn = scores_BKXn + bias_BNLn.reshape(B, K, X, n)
  mask_B11Ln = lay.mask()[:, :, None]
  # The products' input dtype: the compute dtype, or float32 when the cache is narrower
  # (model.cache_dtype) and its values are widened.
  weights_BKXn = masked_softmax(scores_BKXn.reshape(B, K, X // L, L, n), mask_B11Ln).reshape(
      B, K, X, n).astype(jnp.promote_types(q_BKXH.dtype, v_blocks[0].dtype))
  out_BKXH, start = 0, 0
  for vb, size in zip(v_blocks, sizes):
    out_BKXH = out_BKXH + jnp.einsum("bkxn,bknh->bkxh", weights_BKXn[..., start:start + size],
                                     vb, preferred_element_type=jnp.float32)
    start += size
  return out_BKXH


def cached(q_BLNH, k_blocks, v_blocks, layout: Layout, terms, *, scale, filled=None,
           kernel=False):
  """out_BLNH of the queries over the first `filled` slots of a cache held as blocks
  [B, K, b_j, H] (to_blocks), S_cache slots in all.

  `kernel`: use the CPU kernel (transformer/cpu/cached_attention.py) where it applies. It
  reads exactly the filled slots with every core of the device; elsewhere (another backend,
  a score bias, no AVX2) the prefixes below run. The blocks may be narrower than the queries
  (model.cache_dtype); the output has the queries' dtype.

  `filled` defaults to what the layout's queries have written (filled_slots): the layout's
  keys describe the cache slots (decode.step_layout). Blocks past the chosen prefix are never
  read; filled slots the layout masks (padding, outside the window) are read and masked."""
  B, L, N, H = q_BLNH.shape
  K = k_blocks[0].shape[1]
  G = N // K
  # Queries grouped by their key/value head: [B, K, G * L, H], one contraction per head.
  q_BKXH = jnp.transpose(q_BLNH.reshape(B, L, K, G, H), (0, 2, 3, 1, 4)).reshape(B, K, G * L, H)
  lengths = tuple(itertools.accumulate(kb.shape[2] for kb in k_blocks))
  if filled is None:
    filled = filled_slots(layout, lengths[-1])
  if kernel and cached_attention.refusal(q_BKXH, k_blocks, layout, terms) is None:
    out_BKXH = cached_attention.attention(q_BKXH, tuple(k_blocks), tuple(v_blocks), layout,
                                          filled, scale=scale)
    return _ungroup(out_BKXH, L).astype(q_BLNH.dtype)
  branches = [lambda q, k, v, lay, m=m: _prefix(q, k[:m], v[:m], lay, terms, scale)
              for m in range(1, len(lengths) + 1)]
  k_blocks, v_blocks = tuple(k_blocks), tuple(v_blocks)
  if isinstance(filled, int):
    which = next(i for i, n in enumerate(lengths) if n >= filled)
    out_BKXH = branches[which](q_BKXH, k_blocks, v_blocks, layout)
  else:
    which = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), filled)  # first n >= filled
    out_BKXH = jax.lax.switch(which, branches, q_BKXH, k_blocks, v_blocks, layout)
  return _ungroup(out_BKXH, L).astype(q_BLNH.dtype)


def _ungroup(out_BKXH, L):
  """[B, K, G * L, H] -> [B, L, K * G, H]: the queries back in their own order."""
  B, K, X, H = out_BKXH.shape
  G = X // L
  return jnp.transpose(out_BKXH.reshape(B, K, G, L, H), (0, 3, 1, 2, 4)).reshape(B, L, K * G, H)
