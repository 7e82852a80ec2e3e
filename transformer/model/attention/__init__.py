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
  accelerators.py  cudnn, structured_attention, fused_cpu
  pallas.py        splash (TPU), pallas_gpu (GPU)
  module.py        Attention (+ KV cache), dense_init, per_token
  cached.py        cached: a decoding step over the filled cache slots, in key blocks
"""

import jax
import jax.numpy as jnp

from transformer.cpu import fused_attention
from transformer.model.attention.accelerators import (cudnn, cudnn_refusal, fused_cpu,
                                                      masked_attention, structure_refusal,
                                                      structured_attention)
from transformer.model.attention.approximate import block_local_mask, block_sparse, linear
from transformer.model.attention.blockwise import chunked, query_blocks
from transformer.model.attention.layout import Layout, make_layout
from transformer.model.attention.pallas import (pallas_gpu, pallas_gpu_refusal, splash,
                                                splash_refusal)
from transformer.model.attention.reference import dense, dense_weights, masked_softmax

HALF = ("bfloat16", "float16")
LARGE_SCORES = 8192 * 8192  # per head group: past this the score matrix is chunked

# What each row of AUTO_TABLE checks beyond its implementation's own refusal: None or why not.
AUTO_CONDITIONS = {
    "structured": lambda q, k, lay, terms: structure_refusal(q, k, lay, terms),
    "query_tile": lambda q, k, lay, terms: (
        None if q.shape[1] >= fused_attention.QUERY_TILE
        else f"fewer than {fused_attention.QUERY_TILE} queries (one tile)"),
    "large": lambda q, k, lay, terms: (
        None if q.shape[1] * k.shape[1] > LARGE_SCORES else "the score matrix fits"),
}
REFUSALS = {
    "cudnn": cudnn_refusal,
    "splash": splash_refusal,
    "pallas_gpu": pallas_gpu_refusal,
    "fused_cpu": lambda q, k, lay, terms: fused_attention.refusal(q, k, lay, terms),
}

# auto's choice, one row per (backend, compute dtype, feature): the first row whose backend
# (None: any) and dtype (None: any) match, whose condition holds and whose implementation does
# not refuse the call. docs/design.md (Attention) shows the same table.
AUTO_TABLE = (
    # backend  dtypes  implementation  condition     what the row is for
    ("tpu", None, "splash", None),            # causal/window/packing/GQA, L % 128 == 0, no bias
    ("gpu", HALF, "cudnn", "structured"),     # causal, right padding, causal window, bias
    ("gpu", HALF, "pallas_gpu", None),        # packed segments (causal), no bias or window
    ("gpu", HALF, "cudnn", None),             # the rest: prefix, packing + bias, via the mask
    ("cpu", ("float32",), "fused_cpu", "query_tile"),  # AVX-512/AVX2, no bias/window/prefix
    (None, None, "chunked", "large"),         # long sequences anywhere
    ("cpu", None, "query_blocks", None),
    (None, None, "dense", None),
)


def choose(backend, q_BLNH, k_BSKH, layout, terms) -> str:
  """The implementation AUTO_TABLE gives for this call on `backend`."""
  for row_backend, dtypes, name, condition in AUTO_TABLE:
    if row_backend not in (None, backend):
      continue
    if dtypes is not None and q_BLNH.dtype.name not in dtypes:
      continue
    if condition is not None and AUTO_CONDITIONS[condition](q_BLNH, k_BSKH, layout, terms):
      continue
    if name in REFUSALS and REFUSALS[name](q_BLNH, k_BSKH, layout, terms) is not None:
      continue
    return name
  return "dense"


def auto(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """The implementation AUTO_TABLE chooses for the default backend (see there)."""
  name = choose(jax.default_backend(), q_BLNH, k_BSKH, layout, terms)
  return IMPLEMENTATIONS[name](q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale, cfg=cfg)


IMPLEMENTATIONS = {"dense": dense, "chunked": chunked, "query_blocks": query_blocks,
                   "fused_cpu": fused_cpu, "cudnn": cudnn, "splash": splash,
                   "pallas_gpu": pallas_gpu, "linear": linear,
                   "block_sparse": block_sparse, "auto": auto}


def get_implementation(name: str):
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"Unknown model.attention {name!r}; valid: {sorted(IMPLEMENTATIONS)}.")
  return IMPLEMENTATIONS[name]


# Imported last: the module looks implementations up in the registry above.
from transformer.model.attention.module import CACHE_MODES, Attention  # noqa: E402
