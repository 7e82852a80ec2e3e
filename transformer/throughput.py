"""Compute accounting for training runs: parameter counts, FLOPs per token, peak and MFU.

    flops_per_token = 6 * N_non_embedding + 6 * n_attn_layers * n_ctx * d_attn

Kaplan et al.'s convention, the same as `python -m transformer.inspect` (6N: a multiply-add
is 2 flops, backward costs twice the forward; attention: q.k and p.v at 2 * n_ctx * d_attn
each per token, times 3, halved for the causal triangle; an encoder-decoder counts encoder
self-, decoder self- and cross-attention layers). Embedding tables, learned position tables
and an untied output projection are outside N, as in inspect.

transformer.inspect holds the reference implementation, but it defines absl flags at import,
so the train command (which defines its own) cannot import it; the counts are kept identical
here and checked against it in tests/train_test.py.
"""

import math

import time

import jax
import jax.numpy as jnp

# Parameters outside N: token/segment/position tables and an untied output projection.
_EMBEDDING_NAMES = ("embedding", "token_type_embedding", "pos_embedding")

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


def count_params(params_shapes) -> tuple[int, int]:
  """(total, non-embedding) parameter counts of an (abstract) parameter tree."""
  total = embedding = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params_shapes):
    names = [getattr(k, "key", str(k)) for k in path]
    size = math.prod(leaf.shape)
    total += size
    if names[-1] in _EMBEDDING_NAMES or names[-2:] == ["logits", "kernel"]:
      embedding += size
  return total, total - embedding


def flops_per_token(model_config, seq_len: int, params_non_embedding: int) -> int:
  m = model_config
  if m.kind == "encoder_decoder":
    attn_layers = (m.num_encoder_layers or m.num_layers) + 2 * (m.num_decoder_layers
                                                                or m.num_layers)
  else:
    attn_layers = m.num_layers
  d_attn = m.num_heads * (m.head_dim or m.d_model // m.num_heads)
  context = min(seq_len, m.window) if m.window else seq_len
  return 6 * params_non_embedding + 6 * attn_layers * context * d_attn


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
