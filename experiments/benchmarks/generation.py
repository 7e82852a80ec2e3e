"""Generation speed with and without the KV cache: a W1-sized decoder, fp32, one sequence.

  python -m experiments.benchmarks.generation [--new_tokens 128,256,512,1024] [--prompt 16]

W1: vocab 256, d_model 256, 4 layers, 4 heads, d_ff 1024 GELU, learned positions (max_len
covers prompt + new tokens), fp32, greedy, no stop token (every run makes exactly T tokens).

  cache     decode.generate: one prefill, then one step per token (a lax.while_loop) that
            computes the new token's query/key/value and attends to the cache
  recompute the full forward pass for every new token over a fixed [1, prompt + T] buffer
            (the not-yet-generated part is masked by causality, so one compiled program
            serves every step); logits are read at the last real position

Both produce the same tokens (checked). With the cache the matmul work per token is fixed
and only attention grows with the cache length, so the total grows ~linearly in T; without it
every token pays a full pass over prompt + T positions, so the total grows ~quadratically.
Compilation is excluded: the cached path is warmed up once, the recompute path compiled ahead.
"""

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import cli
from transformer.schema import model_config, position_config
from transformer.inference import decode
from transformer.model import models

_NEW = flags.DEFINE_list("new_tokens", ["128", "256", "512", "1024"], "Lengths to generate.")
_PROMPT = flags.DEFINE_integer("prompt", 16, "Prompt length (tokens).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs of the cached path (median).")
_RECOMPUTE_MAX = flags.DEFINE_integer("recompute_max", 1024,
                                      "Skip the recompute path above this many new tokens.")


def w1(max_len: int):
  return model_config(kind="decoder", vocab_size=256, d_model=256, num_layers=4, num_heads=4,
                      d_ff=1024, ffn="gelu", position=position_config("learned"),
                      max_len=max_len, dtype="float32", attention="dense")


@functools.partial(jax.jit, static_argnames=("model", "new_tokens"))
def recompute_generate(model, params, prompt_1P, *, new_tokens):
  P = prompt_1P.shape[1]
  buf_1L = jnp.zeros((1, P + new_tokens), jnp.int32).at[:, :P].set(prompt_1P)

  def body(t, buf_1L):
    logits_1LV = model.apply({"params": params}, buf_1L)
    nxt = jnp.argmax(jax.lax.dynamic_index_in_dim(logits_1LV, P + t - 1, 1, False), -1)
    return jax.lax.dynamic_update_slice_in_dim(buf_1L, nxt[:, None].astype(jnp.int32),
                                               P + t, 1)

  return jax.lax.fori_loop(0, new_tokens, body, buf_1L)[:, P:]


def timed(fn):
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - start, out


def main(argv):
  del argv
  lengths = [int(n) for n in _NEW.value]
  P = _PROMPT.value
  cfg = w1(max_len=P + max(lengths))
  model = decode.frozen(models.make_model(cfg))
  params = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  prompt = np.random.default_rng(0).integers(4, 256, size=P).tolist()
  print(f"W1 decoder, fp32, batch 1, prompt {P}; {jax.device_count()} {jax.default_backend()} "
        f"device(s), {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}")
  print("| new tokens | cache: s | cache: tokens/s | recompute: s | recompute: tokens/s | "
        "speed-up |")
  print("| ---: | ---: | ---: | ---: | ---: | ---: |")
  rows = []
  for T in lengths:
    run = lambda: decode.generate(model, params, [prompt], max_new_tokens=T, stop_tokens=())
    run()  # compile
    times = []
    for _ in range(_REPEATS.value):
      seconds, cached = timed(run)
      times.append(seconds)
    t_cache = float(np.median(times))
    t_full = None
    if T <= _RECOMPUTE_MAX.value:
      compiled = recompute_generate.lower(model, params, jnp.asarray([prompt], jnp.int32),
                                          new_tokens=T).compile()
      t_full, full = timed(lambda: compiled(params, jnp.asarray([prompt], jnp.int32)))
      if not np.array_equal(np.asarray(full), cached):
        print(f"  note: T={T}: recomputed tokens differ from cached ones (float ties?)")
    rows.append((T, t_cache, t_full))
    full_cols = (f"{t_full:.2f} | {T / t_full:.1f} | {t_full / t_cache:.0f}x" if t_full
                 else "- | - | -")
    print(f"| {T} | {t_cache:.3f} | {T / t_cache:.0f} | {full_cols} |", flush=True)

  # Growth: the exponent k in time ~ T^k between the shortest and the longest length.
  (t0, c0, f0), (t1, c1, f1) = rows[0], rows[-1]
  k = lambda a, b: np.log(b / a) / np.log(t1 / t0)
  print(f"growth from {t0} to {t1} new tokens: cache time x{c1 / c0:.1f} (~T^{k(c0, c1):.2f})"
        + (f", recompute time x{f1 / f0:.1f} (~T^{k(f0, f1):.2f})" if f0 and f1 else ""))


if __name__ == "__main__":
  cli.run(main)
