"""The reference implementation: dense scores, float32 softmax, every other one is tested
against it.

  scores_BKGLS = q . k / sqrt(H) + positional bias, masked; weights = softmax(scores); out = weights . v
"""

import jax
import jax.numpy as jnp


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
