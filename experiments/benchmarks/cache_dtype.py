"""The KV cache's dtype on the W1 decoder: float32 against bfloat16 (model.cache_dtype), in
interleaved rounds.

  python -m experiments.benchmarks.cache_dtype [--batch 8] [--new_tokens 256,1024,4096] \
      [--rounds 5] [--quick]

The W1 decoder of experiments/benchmarks/decoding.py (random weights, fp32 compute,
model.attention=auto: the decoding kernel on a CPU), prompts of 16 random tokens, greedy, no
stop token. Every (dtype, length) program is compiled and run once before the first round;
each round then decodes every length with a float32 cache and then with a bfloat16 one, so
both see the same machine state. It prints per length the median seconds of each dtype and
the mean over rounds of the float32 / bfloat16 time ratio with its t 95% interval; per dtype
the growth exponent k of time ~ T^k between consecutive lengths (mean over rounds, t 95%);
and how many new tokens the two caches agree on (greedy: up to a float near-tie).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer import cli
from transformer.inference import decode
from transformer.model import models
from transformer.training import throughput
from experiments.benchmarks.decoding import agreeing, exponent, w1
from experiments.benchmarks.intervals import mean_ci95

_BATCH = flags.DEFINE_integer("batch", 8, "Rows decoded together.")
_NEW = flags.DEFINE_list("new_tokens", ["256", "1024", "4096"], "Lengths to generate.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved rounds (2 or more).")
_QUICK = flags.DEFINE_bool("quick", False, "Batch 2, 8 and 16 tokens, 2 rounds: a smoke test.")
DTYPES = ("float32", "bfloat16")
PROMPT = 16


def interval(values) -> str:
  mean, lo, hi = mean_ci95(values)
  return f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


def main(argv):
  del argv
  B, rounds = (2, 2) if _QUICK.value else (_BATCH.value, _ROUNDS.value)
  lengths = [8, 16] if _QUICK.value else sorted(int(n) for n in _NEW.value)
  if rounds < 2 or B < 1 or len(lengths) < 2:
    raise ValueError("use --rounds >= 2, --batch >= 1 and two or more --new_tokens")
  models_ = {dt: decode.frozen(models.make_model(w1(PROMPT + lengths[-1], attention="auto",
                                                    cache_dtype=dt))) for dt in DTYPES}
  params = models_["float32"].init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  prompts = np.random.default_rng(0).integers(4, 256, size=(B, PROMPT)).tolist()

  def run(dt, T):
    start = time.perf_counter()
    tokens = jax.block_until_ready(decode.generate(models_[dt], params, prompts,
                                                   max_new_tokens=T, stop_tokens=()))
    return time.perf_counter() - start, np.asarray(tokens)

  print(f"W1 decoder, fp32 compute, batch {B}, prompt {PROMPT}, model.attention=auto, "
        f"{rounds} rounds; {jax.devices()[0].platform}; memory read (sum of 256 MiB, best of "
        f"5): {throughput.measure_read_bandwidth() / 1e9:.1f} GB/s")
  tokens = {(dt, T): run(dt, T)[1] for dt in DTYPES for T in lengths}  # compile, warm up
  seconds = {(dt, T): [] for dt in DTYPES for T in lengths}
  for r in range(rounds):
    for T in lengths:
      for dt in DTYPES:
        seconds[dt, T].append(run(dt, T)[0])
    print(f"round {r + 1}: " + ", ".join(f"{T}: {seconds['float32', T][-1]:.3f} / "
                                         f"{seconds['bfloat16', T][-1]:.3f} s" for T in lengths),
          flush=True)
  print("| new tokens | float32: s | bfloat16: s | float32 / bfloat16 (t 95%) | tokens agree |")
  print("| ---: | ---: | ---: | ---: | ---: |")
  for T in lengths:
    ratios = [a / b for a, b in zip(seconds["float32", T], seconds["bfloat16", T])]
    agree = agreeing(tokens["float32", T], tokens["bfloat16", T])
    print(f"| {T} | {np.median(seconds['float32', T]):.3f} | "
          f"{np.median(seconds['bfloat16', T]):.3f} | {interval(ratios)} | {agree}/{B * T} |")
  for dt in DTYPES:
    for T1, T2 in zip(lengths, lengths[1:]):
      ks = [exponent(a, b, T1, T2) for a, b in zip(seconds[dt, T1], seconds[dt, T2])]
      print(f"{dt}: {T1} -> {T2} new tokens, time ~T^k, k = {interval(ks)}")


if __name__ == "__main__":
  cli.run(main)
