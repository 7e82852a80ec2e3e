"""Compute accounting of training runs: FLOPs per token, the hardware's peak, hence MFU.

The model side is transformer/analysis/model_stats.py's count (shared with the inspect tool), so the FLOPs
a run records in summary.json are the ones the scaling fits and `inspect` report.
"""

import time

import jax
import jax.numpy as jnp

from transformer.analysis import model_stats

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


def flops_per_token(model_config, seq_len: int, params_non_embedding: int,
                    params_total: int | None = None, convention: str = "non_embedding") -> int:
  """Training FLOPs per token as the train command records them (summary.json, MFU).

  convention="non_embedding" (summary.json `flops_per_token`, MFU): 6 * N_non_embedding +
  6 * n_attn_layers * n_ctx * d_attn (Kaplan et al.); "total" (`flops_per_token_total`):
  6 * N_total + the same attention term (Chinchilla / Porian et al. 2024)."""
  terms = model_stats.flops_per_token(model_config, seq_len, params_non_embedding,
                                  params_total if params_total is not None else
                                  params_non_embedding)
  if convention == "non_embedding":
    return terms["total"]
  if convention == "total":
    if params_total is None:
      raise ValueError("the total-parameter FLOPs convention needs params_total")
    return terms["total_params_convention"]
  raise ValueError(f"unknown FLOPs convention {convention!r}; valid: non_embedding, total")


def measure_matmul_peak(n: int = 1024, repeats: int = 5, dtype=jnp.float32) -> float:
  """FLOP/s of an n x n x n jnp.dot on the default device: best of `repeats`."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  return 2 * n ** 3 / _best_seconds(jax.jit(jnp.dot), (a, b), repeats)


def measure_read_bandwidth(mib: int = 256, repeats: int = 5) -> float:
  """Bytes/s of summing an fp32 array of `mib` MiB (far larger than the caches) on the
  default device: what a memory-bound loop such as a decode step's attention can read."""
  x = jnp.ones((mib * 2 ** 18,), jnp.float32)
  return x.nbytes / _best_seconds(jax.jit(jnp.sum), (x,), repeats)


def _best_seconds(fn, args, repeats: int) -> float:
  """The fastest of `repeats` timed calls of fn(*args), after one warm-up (compile) call."""
  fn(*args).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn(*args).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return best


def peak_flops(configured: float = 0.0) -> float:
  """Peak FLOP/s of all devices together: configured per device, looked up, or measured."""
  per_device = configured or PEAK_FLOPS.get(jax.devices()[0].device_kind, 0.0)
  if per_device:
    return per_device * jax.device_count()
  if jax.default_backend() == "cpu":
    # CPU "devices" share the same cores, so the measured rate is already the whole host's.
    return measure_matmul_peak(1024) * jax.process_count()
  return 0.0
