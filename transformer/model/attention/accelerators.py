"""Attention through kernels that live outside XLA's own lowering: cuDNN (GPU, through
jax.nn.dot_product_attention) and the fused CPU kernel (transformer/cpu/fused_attention.py).

jax.nn.dot_product_attention (jax 0.10.2 and 0.12) takes the mask's structure as arguments:
is_causal, query_seq_lengths / key_value_seq_lengths (right padding), local_window_size, a
bias. It has no segment ids and no prefix: the cuDNN packing path (q_offsets / kv_offsets)
exists only in the private jax._src.cudnn API. `structured_attention` makes the structured call
for the layouts that need nothing else and refuses the rest; `cudnn` uses it where it can and
falls back to a materialized [B, 1, L, S] mask (the only way the public API takes segment ids
or a prefix); `auto` sends packed layouts to pallas_gpu first (pallas.py).
"""

import jax
import jax.numpy as jnp

from transformer.cpu import fused_attention


def structure_refusal(q_BLNH, k_BSKH, layout, terms, *, implementation="cudnn") -> str | None:
  """Why the layout cannot be said through dot_product_attention's arguments, or None."""
  L, S = q_BLNH.shape[1], k_BSKH.shape[1]
  if layout.k_prefix_BS is not None:
    return "a prefix-LM prefix has no dot_product_attention argument"
  if layout.segments == "packed":
    return ("the layout may hold several segments per row (packing, left padding): "
            "dot_product_attention has no segment ids")
  if layout.causal or layout.window:
    if layout.index_offset != 0:
      return "causal/window masks need queries and keys to start at the same index"
    if L != S:
      return "causal/window masks need as many queries as keys"
  if layout.window and not layout.causal and implementation == "cudnn":
    return "cuDNN's sliding window is causal only (no right window)"
  return None


def structured_attention(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, implementation):
  """jax.nn.dot_product_attention told the layout's structure instead of given a mask.

  implementation "cudnn" on a GPU, "xla" anywhere (the same arguments, checked on CPU against
  dense). Layout.mask() semantics: |q_idx - k_idx| < window, causal q_idx >= k_idx, keys of
  segment 0 invisible and queries of segment 0 zero."""
  why = structure_refusal(q_BLNH, k_BSKH, layout, terms, implementation=implementation)
  if why is not None:
    raise ValueError(f"structured_attention: {why}; use 'dense' or a masked call.")
  kwargs = {}
  q_len_B = kv_len_B = None
  if layout.segments == "right_padded":
    q_len_B = jnp.sum(layout.q_seg_BL != 0, axis=1, dtype=jnp.int32)
    kv_len_B = jnp.sum(layout.k_seg_BS != 0, axis=1, dtype=jnp.int32)
    kwargs.update(query_seq_lengths=q_len_B, key_value_seq_lengths=kv_len_B)
  if layout.window:
    kwargs["local_window_size"] = (layout.window - 1, 0 if layout.causal else layout.window - 1)
  bias = terms.bias(layout.q_pos_BL, layout.k_pos_BS)
  if bias is not None and implementation == "cudnn":
    bias = bias.astype(q_BLNH.dtype)
  out = jax.nn.dot_product_attention(q_BLNH, k_BSKH, v_BSKH, bias=bias, scale=scale,
                                     is_causal=layout.causal, implementation=implementation,
                                     **kwargs)
  if q_len_B is not None:
    # Padding queries, and every query of a row without keys, are zeros by the contract.
    L = q_BLNH.shape[1]
    valid_BL = (jnp.arange(L)[None] < q_len_B[:, None]) & (kv_len_B[:, None] > 0)
    out = jnp.where(valid_BL[:, :, None, None], out, 0)
  return out.astype(q_BLNH.dtype)


def cudnn_refusal(q_BLNH, k_BSKH, layout, terms) -> str | None:
  """What cuDNN's fused attention cannot take (besides needing a GPU backend)."""
  if q_BLNH.dtype not in (jnp.bfloat16, jnp.float16):
    return f"needs model.dtype bfloat16 or float16, got {q_BLNH.dtype}"
  H = q_BLNH.shape[-1]
  if H % 8 or H > 256:
    return f"needs a head size that is a multiple of 8 and at most 256, got {H}"
  return None


def cudnn(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """cuDNN's fused attention through jax.nn.dot_product_attention (GPU, fp16/bf16 only):
  the structured call where the layout allows, else the layout's mask."""
  if jax.default_backend() != "gpu":
    raise ValueError(f"model.attention='cudnn' needs a GPU (backend is "
                     f"{jax.default_backend()!r}); use 'auto', 'dense' or 'chunked'.")
  if (why := cudnn_refusal(q_BLNH, k_BSKH, layout, terms)) is not None:
    raise ValueError(f"model.attention='cudnn' {why}; set --config.model.dtype=bfloat16 "
                     f"or use 'auto' or 'dense'.")
  if structure_refusal(q_BLNH, k_BSKH, layout, terms) is None:
    return structured_attention(q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale,
                                implementation="cudnn")
  return masked_attention(q_BLNH, k_BSKH, v_BSKH, layout, terms, scale=scale,
                          implementation="cudnn")


def masked_attention(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, implementation):
  """dot_product_attention with the layout's [B, 1, L, S] mask (any layout)."""
  mask = layout.mask()
  bias = terms.bias(layout.q_pos_BL, layout.k_pos_BS)
  if bias is not None and implementation == "cudnn":
    bias = bias.astype(q_BLNH.dtype)
  out = jax.nn.dot_product_attention(q_BLNH, k_BSKH, v_BSKH, bias=bias, mask=mask,
                                     scale=scale, implementation=implementation)
  # Rows with no visible key: the kernel returns an average of everything; the contract is 0.
  has_key = jnp.any(mask, axis=-1)[:, 0, :, None, None]
  return jnp.where(has_key, out, 0).astype(q_BLNH.dtype)


def fused_cpu(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """The fused CPU kernel (transformer/cpu/fused_attention.cc: AVX-512 or AVX2, float32): each
  tile of 64 queries keeps its scores in cache, the backward pass recomputes them
  (FlashAttention-2)."""
  if (why := fused_attention.refusal(q_BLNH, k_BSKH, layout, terms)) is not None:
    raise ValueError(f"model.attention='fused_cpu': {why}; use 'auto' or 'query_blocks'.")
  out = fused_attention.attention(q_BLNH, k_BSKH, v_BSKH, layout, scale=scale)
  return out.astype(q_BLNH.dtype)
