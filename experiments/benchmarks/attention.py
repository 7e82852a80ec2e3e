"""Dense vs chunked attention: peak memory and time of one causal attention layer by length.

  python -m experiments.benchmarks.attention [--lengths 1024,2048,4096,8192,16384]

Memory is XLA's own accounting of the compiled program (temporary buffers plus arguments and
outputs: `compiled.memory_analysis()`), so it is exact and free of allocator noise. Time is
the median of several runs after compilation, forward pass, float32. Dense is skipped where
its program would need more than --max_gib (it would not fit this machine).
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from configs.common import model_config
from transformer import attention
from transformer.positions import AttentionTerms

_LENGTHS = flags.DEFINE_list("lengths", ["1024", "2048", "4096", "8192", "16384"], "Lengths.")
_HEADS = flags.DEFINE_integer("heads", 8, "Query heads (and key/value heads).")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Head dimension.")
_CHUNK = flags.DEFINE_integer("chunk", 512, "Block size of the chunked implementation.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per point (median reported).")
_MAX_GIB = flags.DEFINE_float("max_gib", 12.0, "Skip programs needing more memory than this.")


def measure(impl: str, length: int):
  cfg = model_config(attention_chunk=_CHUNK.value)
  fn = attention.IMPLEMENTATIONS[impl]
  N, H = _HEADS.value, _HEAD_DIM.value
  layout = attention.make_layout(length, length, batch=1, causal=True)
  terms = AttentionTerms()

  def layer(q, k, v):
    return fn(q, k, v, layout, terms, scale=H ** -0.5, cfg=cfg)

  shape = jax.ShapeDtypeStruct((1, length, N, H), jnp.float32)
  compiled = jax.jit(layer).lower(shape, shape, shape).compile()
  mem = compiled.memory_analysis()
  peak = (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)
  if peak > _MAX_GIB.value * 2 ** 30:
    return peak, None
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(1, length, N, H)), jnp.float32) for _ in range(3))
  compiled(q, k, v).block_until_ready()
  times = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    compiled(q, k, v).block_until_ready()
    times.append(time.perf_counter() - start)
  return peak, statistics.median(times)


def main(argv):
  del argv
  print(f"one causal attention layer, batch 1, {_HEADS.value} heads x {_HEAD_DIM.value}, "
        f"float32, chunk {_CHUNK.value}, backend {jax.default_backend()}")
  print(f"{'length':>7} | {'dense MiB':>10} {'dense ms':>9} | {'chunked MiB':>11} "
        f"{'chunked ms':>10} | {'time ratio':>10}")
  for length in map(int, _LENGTHS.value):
    d_mem, d_time = measure("dense", length)
    c_mem, c_time = measure("chunked", length)
    fmt = lambda t: f"{1e3 * t:9.1f}" if t is not None else f"{'n/a':>9}"
    ratio = f"{c_time / d_time:10.2f}" if d_time else f"{'-':>10}"
    print(f"{length:7d} | {d_mem / 2**20:10.1f} {fmt(d_time)} | {c_mem / 2**20:11.1f} "
          f"{fmt(c_time):>10} | {ratio}", flush=True)


if __name__ == "__main__":
  app.run(main)
