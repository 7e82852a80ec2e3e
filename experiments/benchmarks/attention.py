"""Attention implementations: peak memory and time of one causal attention layer by length.

  python -m experiments.benchmarks.attention [--lengths 1024,2048,4096,8192,16384]
      [--impls dense,chunked] [--batch 1] [--heads 8] [--grad]

Memory is XLA's own accounting of the compiled program (temporary buffers plus arguments and
outputs: `compiled.memory_analysis()`), so it is exact and free of allocator noise. Time is
the median of several runs after compilation, float32: the forward pass, or with --grad the
forward and backward (gradients of q, k, v), as in training. A program that would need more
than --max_gib is not run (it would not fit this machine). The last column is each
implementation's time over the first's. Freed memory stays in the process, as in the train
command (transformer.host_memory).
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import cli
from transformer.schema import model_config
from transformer.cpu import host_memory
from transformer.model import attention
from transformer.model.positions import AttentionTerms

_LENGTHS = flags.DEFINE_list("lengths", ["1024", "2048", "4096", "8192", "16384"], "Lengths.")
_HEADS = flags.DEFINE_integer("heads", 8, "Query heads (and key/value heads).")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Head dimension.")
_CHUNK = flags.DEFINE_integer("chunk", model_config().attention_chunk,
                              "Block size of the chunked implementation.")
_QUERY_BLOCK = flags.DEFINE_integer("query_block", model_config().attention_query_block,
                                    "Block size of query_blocks.")
_IMPLS = flags.DEFINE_list("impls", ["dense", "chunked"], "Implementations to compare.")
_BATCH = flags.DEFINE_integer("batch", 1, "Batch size.")
_GRAD = flags.DEFINE_bool("grad", False, "Time forward and backward instead of forward.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per point (median reported).")
_MAX_GIB = flags.DEFINE_float("max_gib", 12.0, "Skip programs needing more memory than this.")


def measure(impl: str, length: int):
  cfg = model_config(attention_chunk=_CHUNK.value, attention_query_block=_QUERY_BLOCK.value)
  fn = attention.IMPLEMENTATIONS[impl]
  N, H = _HEADS.value, _HEAD_DIM.value
  B = _BATCH.value
  layout = attention.make_layout(length, length, batch=B, causal=True)
  terms = AttentionTerms()

  def layer(q, k, v):
    return fn(q, k, v, layout, terms, scale=H ** -0.5, cfg=cfg)
  if _GRAD.value:
    forward = layer
    # A fixed random cotangent: sum(out * g) has the gradients of a real loss.
    g = jax.random.normal(jax.random.key(3), (B, length, N, H))
    layer = jax.grad(lambda q, k, v: jnp.sum(forward(q, k, v) * g), argnums=(0, 1, 2))

  shape = jax.ShapeDtypeStruct((B, length, N, H), jnp.float32)
  compiled = jax.jit(layer).lower(shape, shape, shape).compile()
  mem = compiled.memory_analysis()
  peak = (mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)
  if peak > _MAX_GIB.value * 2 ** 30:
    return peak, None
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(B, length, N, H)), jnp.float32) for _ in range(3))
  jax.block_until_ready(compiled(q, k, v))
  times = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(compiled(q, k, v))
    times.append(time.perf_counter() - start)
  return peak, statistics.median(times)


def main(argv):
  del argv
  host_memory.retain_freed_memory()
  for impl in _IMPLS.value:
    attention.get_implementation(impl)  # an unknown name fails before any compute
  print(f"one causal attention layer, batch {_BATCH.value}, {_HEADS.value} heads x "
        f"{_HEAD_DIM.value}, float32, {'forward + backward' if _GRAD.value else 'forward'}, "
        f"chunk {_CHUNK.value}, query block {_QUERY_BLOCK.value}, backend {jax.default_backend()}")
  print(f"{'length':>7} | " + " | ".join(f"{impl + ' MiB':>18} {'ms':>8} {'ratio':>6}"
                                         for impl in _IMPLS.value))
  for length in map(int, _LENGTHS.value):
    cells, first = [], None
    for impl in _IMPLS.value:
      mem, t = measure(impl, length)
      first = t if first is None else first
      ms = f"{1e3 * t:8.1f}" if t is not None else f"{'n/a':>8}"
      ratio = f"{t / first:6.2f}" if t is not None and first else f"{'-':>6}"
      cells.append(f"{mem / 2**20:18.1f} {ms} {ratio}")
    print(f"{length:7d} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
  cli.run(main)
