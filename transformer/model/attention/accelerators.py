"""Attention through kernels that live outside XLA's own lowering: cuDNN (GPU, through
jax.nn.dot_product_attention) and the fused CPU kernel (transformer/cpu/fused_attention.py)."""

import jax
import jax.numpy as jnp

from transformer.cpu import fused_attention


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


def fused_cpu(q_BLNH, k_BSKH, v_BSKH, layout, terms, *, scale, cfg):
  """The fused CPU kernel (transformer/cpu/fused_attention.cc: AVX-512, float32): each tile of 64
  queries keeps its scores in cache, the backward pass recomputes them (FlashAttention-2)."""
  if (why := fused_attention.refusal(q_BLNH, k_BSKH, layout, terms)) is not None:
    raise ValueError(f"model.attention='fused_cpu': {why}; use 'auto' or 'query_blocks'.")
  out = fused_attention.attention(q_BLNH, k_BSKH, v_BSKH, layout, scale=scale)
  return out.astype(q_BLNH.dtype)
