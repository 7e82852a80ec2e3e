"""A decoding step's attention over the filled slots of a KV cache, as one CPU kernel
(transformer/cpu/cached_attention.cc, built with the fused kernel's library:
fused_attention.py).

The number of filled slots is a runtime value here, so a step reads exactly those slots
(XLA's path in transformer/model/attention/cached.py reads the shortest static prefix that
covers them), and the kernel splits the slots into chunks over the device's cores, where
XLA:CPU runs each row's and head's small products one after another on one thread
(timings: docs/performance.md, "Generation"). The queries and arithmetic are float32; the
cache is float32 or bfloat16 (model.cache_dtype), widened as it is read.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning

from transformer.cpu import fused_attention


def refusal(q_BKXH, k_blocks, layout, terms) -> str | None:
  """Why a step cannot use the kernel (None: it can)."""
  if (why := fused_attention.shared_refusal("cached", layout, terms)) is not None:
    return why
  if q_BKXH.dtype != jnp.float32:
    return f"the cached CPU kernel computes in float32 (queries are {q_BKXH.dtype})"
  if k_blocks[0].dtype not in (jnp.float32, jnp.bfloat16):
    return f"the cached CPU kernel reads a float32 or bfloat16 cache, not {k_blocks[0].dtype}"
  if q_BKXH.shape[-1] % 16 or q_BKXH.shape[-1] > 256:
    return ("the cached CPU kernel needs a head size divisible by 16 and at most 256, got "
            f"{q_BKXH.shape[-1]}")
  return None


def _rule(blocks: int) -> str:
  """Shardy's rule: batch rows and key/value heads may be sharded; everything else is whole."""
  cache = ", ".join(f"b k s{j} h" for j in range(blocks))
  return f"b k x h, b l, b s, b l, b s, b, {cache}, {cache} -> b k x h"


@functools.cache
def _op(blocks: int, statics: tuple):
  scale, causal, window = statics

  def caller(n_threads):
    def call(*args):
      return jax.ffi.ffi_call("transformer_attention_cached",
                              jax.ShapeDtypeStruct(args[0].shape, jnp.float32))(
          *args, scale=np.float32(scale), causal=causal, window=np.int64(window),
          threads=np.int64(n_threads))
    return call

  op = custom_partitioning(caller(fused_attention.threads()))

  def partition(mesh, arg_shapes, result_shape):
    return (mesh, caller(fused_attention.threads(mesh)), result_shape.sharding,
            tuple(a.sharding for a in arg_shapes))

  rule = _rule(blocks)
  whole = ("x", "h", "l", "s", *(f"s{j}" for j in range(blocks)))
  op.def_partition(partition=partition, sharding_rule=rule,
                   need_replication_factors=tuple(sorted(whole, key=lambda f: rule.index(f" {f}"))))
  return op


def attention(q_BKXH, k_blocks, v_blocks, layout, filled, *, scale) -> jax.Array:
  """softmax(q k^T * scale, masked by layout) v over the first `filled` slots, exactly:
  float32 [B, K, X, H], queries grouped by key/value head (x = g * L + l, as in cached.py).
  k_blocks/v_blocks: [B, K, b_j, H] (cached.to_blocks), all float32 or all bfloat16 (each
  value widened to float32 as it is read); the layout's keys are the slots."""
  if (why := fused_attention.unavailable()) is not None:  # also registers the kernel
    raise RuntimeError(why)
  B = q_BKXH.shape[0]
  filled_B = jnp.broadcast_to(jnp.asarray(filled, jnp.int32), (B,))
  i32 = lambda x: x.astype(jnp.int32)
  # A bfloat16 cache goes in as its bits: on XLA:CPU the cache holds them (cached.held_dtype),
  # and the two bitcasts cancel, so the kernel reads the cache's own buffers.
  bits = lambda blocks: tuple(jax.lax.bitcast_convert_type(b, jnp.uint16)
                              if b.dtype == jnp.bfloat16 else b for b in blocks)
  statics = (float(scale), bool(layout.causal), int(layout.window or 0))
  return _op(len(k_blocks), statics)(
      q_BKXH.astype(jnp.float32), i32(layout.q_seg_BL), i32(layout.k_seg_BS),
      i32(layout.q_idx_BL), i32(layout.k_idx_BS), filled_B, *bits(k_blocks), *bits(v_blocks))
