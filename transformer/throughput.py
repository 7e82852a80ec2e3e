"""Compute accounting: model FLOPs per token, the hardware's peak, and MFU.

    flops_per_token = 6 * N_non_embedding + attention
    attention       = 6 * L_causal * T * d_attn + 12 * (L_bidirectional + L_cross) * T * d_attn

6N is Kaplan et al.'s training cost of the parameter matmuls (2 flops per multiply-add, times
3 for forward + backward). Per layer, scores (q.k) and the weighted sum (p.v) each cost
2 * T * d_attn flops per token forward, so 12 * T * d_attn for training; a causal layer
only needs the lower triangle, hence 6 (PaLM's appendix B counts it the same way).
d_attn = num_heads * head_dim; a sliding window caps T at the window. The embedding
gather and the tied output projection are outside N, as in Kaplan's fits.
"""

import time

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s per chip, for MFU on accelerators; CPUs are measured instead.
PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
}


def attention_flops_per_token(model_config, seq_len: int) -> int:
  m = model_config
  d_attn = m.num_heads * (m.head_dim or m.d_model // m.num_heads)
  t = min(seq_len, m.window) if m.window else seq_len
  if m.kind == "decoder":
    return 6 * m.num_layers * t * d_attn
  if m.kind == "encoder":
    return 12 * m.num_layers * t * d_attn
  enc = m.num_encoder_layers or m.num_layers
  dec = m.num_decoder_layers or m.num_layers
  # Decoder self-attention is causal; encoder self- and decoder cross-attention are not.
  return 6 * dec * t * d_attn + 12 * (enc + dec) * t * d_attn


def flops_per_token(model_config, seq_len: int, params_non_embedding: int) -> int:
  return 6 * params_non_embedding + attention_flops_per_token(model_config, seq_len)


def measure_matmul_peak(n: int = 1024, repeats: int = 5, dtype=jnp.float32) -> float:
  """FLOP/s of an n x n x n jnp.dot on the default device: best of `repeats`."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    dot(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best


def peak_flops(configured: float = 0.0) -> float:
  """Peak FLOP/s of all devices together: configured per device, looked up, or measured."""
  per_device = configured or PEAK_FLOPS.get(jax.devices()[0].device_kind, 0.0)
  if per_device:
    return per_device * jax.device_count()
  if jax.default_backend() == "cpu":
    # CPU "devices" share the same cores, so the measured rate is already the whole host's.
    return measure_matmul_peak(512) * jax.process_count()
  return 0.0
