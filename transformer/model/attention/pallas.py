"""Attention through JAX's own Pallas kernels (none written here):

  splash      TPU: jax.experimental.pallas.ops.tpu.splash_attention (causal, local window,
              segment ids for packing, MQA/GQA through its MQA kernel per key/value head)
  pallas_gpu  GPU: jax.experimental.pallas.ops.gpu.attention.mha (Triton; causal, one
              segment-id array for queries and keys; GQA by repeating key/value heads)

Off their backend both run in Pallas interpret mode (slow, exact: how tests/accelerators_test.py
checks them on CPU). Neither takes a score bias (ALiBi, T5) or a prefix-LM prefix; both need
self-attention layouts (as many queries as keys, starting at the same index). Queries of
segment 0 (padding) see the padding keys inside the kernel, which keeps their rows finite, and
come out as zeros afterwards; real queries never see segment 0.

A Pallas kernel is a custom call that XLA's SPMD partitioner cannot split ("Mosaic kernels
cannot be automatically partitioned"), so under a mesh (training/sharding.activate) both run
per device through shard_map: each device gets its batch rows (data, fsdp) and its heads
(tensor), which is all attention needs, since neither rows nor heads see each other.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from transformer.model.dense import logical_spec


def per_device(kernel, q_BLNH, k_BSKH, v_BSKH, q_seg_BL, k_seg_BS):
  """kernel(q, k, v, q_seg, k_seg) on each device's rows and heads under the installed mesh
  (shard_map), or once where there is none. Heads are split only when the key/value heads
  split with them (or there is one, MQA), so every query head keeps its key/value head."""
  q_spec = logical_spec(q_BLNH.shape, ("batch", "length", "heads", "head_dim"))
  if q_spec is None:
    return kernel(q_BLNH, k_BSKH, v_BSKH, q_seg_BL, k_seg_BS)
  k_spec = logical_spec(k_BSKH.shape, ("batch", "length", "kv_heads", "head_dim"))
  rows = q_spec[0] if q_spec[0] == k_spec[0] else None
  heads = q_spec[2]
  kv_heads = k_spec[2] if k_spec[2] == heads else None
  if kv_heads is None and k_BSKH.shape[2] != 1:
    heads = None
  qkv = (P(rows, None, heads, None), P(rows, None, kv_heads, None),
         P(rows, None, kv_heads, None))
  return jax.shard_map(kernel, in_specs=(*qkv, P(rows, None), P(rows, None)),
                       out_specs=qkv[0], check_vma=False)(
      q_BLNH, k_BSKH, v_BSKH, q_seg_BL, k_seg_BS)


def _common_refusal(q_BLNH, k_BSKH, layout, terms, dtypes) -> str | None:
  L, S = q_BLNH.shape[1], k_BSKH.shape[1]
  if terms.bias_table is not None:
    return "no score bias (ALiBi, T5): use RoPE/none positions or another implementation"
  if layout.k_prefix_BS is not None:
    return "no prefix-LM prefix"
  if L != S or layout.index_offset != 0:
    return (f"self-attention layouts only (as many queries as keys from the same index); got "
            f"{L} queries, {S} keys, index offset {layout.index_offset}")
  if q_BLNH.dtype.name not in dtypes:
    return f"dtype {q_BLNH.dtype} (takes {', '.join(dtypes)})"
  return None


# ---------------------------------------------------------------------------------------------
# splash (TPU)

SPLASH_BLOCKS = (512, 256, 128)  # block sizes are multiples of the TPU's 128 lanes


def splash_refusal(q_BLNH, k_BSKH, layout, terms) -> str | None:
  if (why := _common_refusal(q_BLNH, k_BSKH, layout, terms, ("float32", "bfloat16"))):
    return why
  L = q_BLNH.shape[1]
  if L % SPLASH_BLOCKS[-1]:
    return f"sequence length {L} is not a multiple of {SPLASH_BLOCKS[-1]} (its block size)"
  return None


@functools.lru_cache(maxsize=64)
def _splash_kernel(L, heads, causal, window, is_mqa, interpret):
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  if window:
    one = sa.LocalMask((L, L), (window - 1, 0 if causal else window - 1), offset=0)
  elif causal:
    one = sa.CausalMask((L, L))
  else:
    one = sa.FullMask((L, L))
  b = next(b for b in SPLASH_BLOCKS if L % b == 0)
  sizes = sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                        block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  make = sa.make_splash_mqa_single_device if is_mqa else sa.make_splash_mha_single_device
  # Its mask tables become jnp arrays: concrete ones, not tracers of the caller's jit, so
  # the cached kernel can serve every trace.
  with jax.ensure_compile_time_eval():
    return make(sa.MultiHeadMask([one] * heads), block_sizes=sizes, interpret=interpret)


def splash(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """Splash attention (TPU; interpret mode elsewhere)."""
  if (why := splash_refusal(q_BLNH, k_BSKH, layout, terms)) is not None:
    raise ValueError(f"model.attention='splash': {why}; use 'auto' or 'chunked'.")
  q = (q_BLNH * jnp.asarray(scale, q_BLNH.dtype)).astype(q_BLNH.dtype)  # splash has no scale
  kernel = functools.partial(_splash_local, causal=layout.causal, window=layout.window,
                             segmented=layout.segments != "single")
  out = per_device(kernel, q, k_BSKH, v_BSKH, layout.q_seg_BL, layout.k_seg_BS)
  return out.astype(q_BLNH.dtype)


def _splash_local(q_BLNH, k_BSKH, v_BSKH, q_seg, k_seg, *, causal, window, segmented):
  """splash on one device's rows and heads (already scaled queries)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  B, L, N, H = q_BLNH.shape
  K = k_BSKH.shape[2]
  interpret = jax.default_backend() != "tpu"
  k, v = jnp.moveaxis(k_BSKH, 2, 1), jnp.moveaxis(v_BSKH, 2, 1)  # [B, K, S, H]

  def one_row(q_, k_, v_, qs, ks, kernel):
    ids = sa.SegmentIds(q=qs, kv=ks) if segmented else None
    return kernel(q_, k_, v_, segment_ids=ids)

  if K == N:
    kernel = _splash_kernel(L, N, causal, window, False, interpret)
    out = jax.vmap(functools.partial(one_row, kernel=kernel))(
        jnp.moveaxis(q_BLNH, 2, 1), k, v, q_seg, k_seg)               # [B, N, L, H]
    out = jnp.moveaxis(out, 1, 2)
  else:  # MQA kernel per key/value head: queries [G, L, H] against keys [S, H]
    G = N // K
    kernel = _splash_kernel(L, G, causal, window, True, interpret)
    q_BKGLH = q_BLNH.reshape(B, L, K, G, H).transpose(0, 2, 3, 1, 4)
    per_head = jax.vmap(functools.partial(one_row, kernel=kernel), in_axes=(0, 0, 0, None, None))
    out = jax.vmap(per_head)(q_BKGLH, k, v, q_seg, k_seg)            # [B, K, G, L, H]
    out = out.transpose(0, 3, 1, 2, 4).reshape(B, L, N, H)
  if segmented:
    out = jnp.where((q_seg != 0)[:, :, None, None], out, 0)
  return out


# ---------------------------------------------------------------------------------------------
# pallas_gpu (Triton)

GPU_BLOCKS = (128, 64, 32)


def pallas_gpu_refusal(q_BLNH, k_BSKH, layout, terms) -> str | None:
  why = _common_refusal(q_BLNH, k_BSKH, layout, terms, ("float32", "bfloat16", "float16"))
  if why:
    return why
  if layout.window:
    return "no sliding window"
  if not layout.causal and layout.segments != "single":
    # One segment-id array serves queries and keys; a non-causal layout with segments may be
    # cross-attention (decoder segments against encoder segments), which the Layout cannot say.
    return "segment ids only with a causal (self-attention) layout"
  L, H = q_BLNH.shape[1], q_BLNH.shape[-1]
  if H < 16 or H & (H - 1):
    return f"head size {H} is not a power of two >= 16"
  if L % GPU_BLOCKS[-1]:
    return f"sequence length {L} is not a multiple of {GPU_BLOCKS[-1]} (its block size)"
  return None


def pallas_gpu(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """JAX's Pallas (Triton) FlashAttention for GPUs (interpret mode elsewhere)."""
  if (why := pallas_gpu_refusal(q_BLNH, k_BSKH, layout, terms)) is not None:
    raise ValueError(f"model.attention='pallas_gpu': {why}; use 'auto' or 'cudnn'.")
  kernel = functools.partial(_pallas_gpu_local, scale=scale, causal=layout.causal,
                             segmented=layout.segments != "single")
  out = per_device(kernel, q_BLNH, k_BSKH, v_BSKH, layout.q_seg_BL, layout.k_seg_BS)
  return out.astype(q_BLNH.dtype)


def _pallas_gpu_local(q_BLNH, k_BSKH, v_BSKH, q_seg, k_seg, *, scale, causal, segmented):
  """The Triton kernel on one device's rows and heads (one segment array: causal layouts)."""
  from jax.experimental.pallas.ops.gpu import attention as gpu_attention
  L, N = q_BLNH.shape[1], q_BLNH.shape[2]
  K = k_BSKH.shape[2]
  k, v = k_BSKH, v_BSKH
  if K != N:  # the kernel has no head groups
    k, v = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
  b = next(b for b in GPU_BLOCKS if L % b == 0)
  sizes = gpu_attention.BlockSizes(block_q=b, block_k=b, block_q_dkv=32, block_kv_dkv=32,
                                   block_q_dq=32, block_kv_dq=32)
  seg = q_seg if segmented else None
  out = gpu_attention.mha(q_BLNH, k, v, seg, sm_scale=scale, causal=causal,
                          block_sizes=sizes, interpret=jax.default_backend() != "gpu")
  if segmented:
    out = jnp.where((seg != 0)[:, :, None, None], out, 0)
  return out
