"""Attention: masks described per position, interchangeable implementations (a registry),
and the Attention module with its KV cache.

  scores_BKGLS = q . k / sqrt(H) + positional bias, masked; weights = softmax(scores); out = weights . v

Queries have N heads, keys and values K heads (N = K * G): MHA is K = N, MQA is K = 1, GQA
anything between. Every implementation is fn(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale,
cfg) -> out_BLNH, must agree with `dense` (reference.py, softmax in float32) or refuse a
feature it cannot honour with a clear error.

  layout.py        Layout, make_layout
  reference.py     dense
  blockwise.py     chunked, query_blocks
  approximate.py   linear, block_sparse
  accelerators.py  cudnn, fused_cpu
  module.py        Attention (+ KV cache), dense_init, per_token
"""

import jax
import jax.numpy as jnp

from transformer.cpu import fused_attention
from transformer.model.attention.accelerators import cudnn, fused_cpu
from transformer.model.attention.approximate import block_local_mask, block_sparse, linear
from transformer.model.attention.blockwise import chunked, query_blocks
from transformer.model.attention.layout import Layout, make_layout
from transformer.model.attention.reference import dense, dense_weights, masked_softmax


def auto(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """cuDNN on GPU in half precision; on CPU the fused kernel where it applies (float32, no
  score bias, window or prefix, head size a multiple of 16, at least one full tile of 64
  queries: a decoding step's single query would waste the rest of the tile; it needs AVX-512
  and a C++ compiler); otherwise chunked once the score matrix would not fit comfortably
  (64M scores per head group), query_blocks on CPU, dense elsewhere."""
  if jax.default_backend() == "gpu" and q_BLNH.dtype in (jnp.bfloat16, jnp.float16):
    return cudnn(q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale, cfg=cfg)
  if (q_BLNH.shape[1] >= fused_attention.QUERY_TILE
      and fused_attention.refusal(q_BLNH, k_BSKH, layout, terms) is None):
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


# Imported last: the module looks implementations up in the registry above.
from transformer.model.attention.module import CACHE_MODES, Attention  # noqa: E402
