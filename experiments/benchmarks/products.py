r"""A training step's matrix products, timed in XLA and in PyTorch on this CPU.

    python -m experiments.benchmarks.products [--workloads W1,W2] [--repeats 5] [--timings 5]

Needs the interop extra (torch). The train_throughput workloads spend most of a step in the
projections' products, so the ratio of the two frameworks' product times at the step's own
shapes is the lead over PyTorch (train_throughput_torch.py) that faster code around the
products can add to. Each projection x[T, I] W[I, O] over a step's T tokens costs three
products, each timed in the layout its framework's step uses:

  forward   x W            both: [T, I] x [I, O]
  input     dy W^T         both: [T, O] x [O, I], W read transposed in place
  weight    x^T dy         XLA: [min(I, O), T] x [T, max(I, O)] on a transposed copy
                           (transformer/cpu/projection.py); PyTorch: dy^T x, [O, T] x [T, I]
                           with dy read transposed in place (autograd's form for nn.Linear)

The projections are the model's q, k, v, o (d x d each), up (d x d_ff), down (d_ff x d) per
layer, and the tied output head (d x vocab). PyTorch's own train_throughput_torch model fuses
q, k and v into one d x 3d product; here both frameworks run the same shapes. Attention's
products (the fused kernel / scaled_dot_product_attention) and the copies are not counted.

Each product's time is the median over --timings timings of 8 calls in a row (jax dispatches
the next call while one runs, as inside a step; torch's calls return when done). --repeats
interleaved rounds (the frameworks alternate their order) give each product's median, and the
step's sum of products per round gives the ratio of the two sums: its mean over rounds with a t
95% interval.
"""

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from absl import flags

from transformer import cli
from experiments.benchmarks import train_command  # noqa: F401 (its flags: --repeats, rounds)
from experiments.benchmarks.intervals import mean_ci95
from experiments.benchmarks.train_throughput import WORKLOADS

FLAGS = flags.FLAGS
FLAGS.set_default("repeats", 5)
_TIMINGS = flags.DEFINE_integer("timings", 5, "Timings per product per round (median).")


def products(name: str) -> list[tuple[str, int, int, int, int]]:
  """(label, I, O, T, count): each distinct projection shape of one step and how many."""
  w = WORKLOADS[name]
  m, T = w["model"], w["batch_size"] * w["seq_len"]
  d, ff, layers = m["d_model"], m["d_ff"], m["num_layers"]
  return [("qkvo d x d", d, d, T, 4 * layers), ("up d x d_ff", d, ff, T, layers),
          ("down d_ff x d", ff, d, T, layers), ("head d x vocab", d, 256, T, 1)]


_CALLS = 8  # back-to-back calls per timing: jax dispatches them ahead of the running one


def _median_seconds(call, wait, repeats: int) -> float:
  """Median over `repeats` of the time per call of _CALLS calls in a row, waiting for the last
  one only, as a step's products run one after another without a host round trip."""
  wait(call())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(_CALLS):
      out = call()
    wait(out)
    times.append((time.perf_counter() - start) / _CALLS)
  return statistics.median(times)


def xla_times(I, O, T, repeats) -> dict[str, float]:
  rng = np.random.default_rng(0)
  x_TI, w_IO, dy_TO = (jnp.asarray(rng.normal(size=s), jnp.float32)
                       for s in ((T, I), (I, O), (T, O)))
  lo, hi = (x_TI, dy_TO) if I <= O else (dy_TO, x_TI)
  lo_T = jnp.asarray(np.ascontiguousarray(np.asarray(lo).T))  # projection.py's copy
  forward = jax.jit(lambda a, b: a @ b)
  input_grad = jax.jit(lambda a, b: a @ b.T)
  timed = lambda f, *a: _median_seconds(lambda: f(*a), jax.block_until_ready, repeats)
  return {"forward": timed(forward, x_TI, w_IO), "input": timed(input_grad, dy_TO, w_IO),
          "weight": timed(forward, lo_T, hi)}


def torch_times(I, O, T, repeats) -> dict[str, float]:
  g = torch.Generator().manual_seed(0)
  x_TI, w_IO, dy_TO = (torch.randn(*s, generator=g) for s in ((T, I), (I, O), (T, O)))
  w_OI = w_IO.t().contiguous()  # nn.Linear stores its weight [O, I]
  timed = lambda call: _median_seconds(call, lambda out: out, repeats)
  with torch.no_grad():
    return {"forward": timed(lambda: torch.mm(x_TI, w_OI.t())),
            "input": timed(lambda: torch.mm(dy_TO, w_OI)),
            "weight": timed(lambda: torch.mm(dy_TO.t(), x_TI))}


def measure(name: str) -> tuple[list[dict], list[float]]:
  """Per product its median times over rounds; per round torch's sum over XLA's."""
  shapes = products(name)
  timer = {"xla": xla_times, "torch": torch_times}
  rounds = []  # per round: {framework: [per shape {kind: seconds}]}
  for r in range(FLAGS.repeats):
    order = ("xla", "torch") if r % 2 == 0 else ("torch", "xla")
    rounds.append({fw: [timer[fw](I, O, T, _TIMINGS.value) for _, I, O, T, _ in shapes]
                   for fw in order})
  rows = []
  for i, (label, I, O, T, count) in enumerate(shapes):
    for kind in ("forward", "input", "weight"):
      median = lambda fw: statistics.median(r[fw][i][kind] for r in rounds)
      rows.append(dict(label=label, kind=kind, count=count, flops=2 * I * O * T,
                       xla_s=median("xla"), torch_s=median("torch")))
  step = lambda r, fw: sum(n * sum(t.values()) for (*_, n), t in zip(shapes, r[fw]))
  return rows, [step(r, "torch") / step(r, "xla") for r in rounds]


def main(argv):
  del argv
  for name in FLAGS.workloads:
    if name not in WORKLOADS:
      raise ValueError(f"unknown workload {name!r}; valid: {sorted(WORKLOADS)}")
  torch.set_num_threads(len(os.sched_getaffinity(0)))  # the cores it may run on (taskset)
  print(f"jax {jax.__version__} ({jax.devices()[0].device_kind} x{jax.device_count()}), torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads); load average "
        f"{os.getloadavg()[0]:.1f}; {FLAGS.repeats} interleaved rounds of {_TIMINGS.value} "
        f"timings")
  if FLAGS.repeats < 2:
    raise ValueError(f"--repeats={FLAGS.repeats}: give 2 or more rounds (the ratio's interval)")
  for name in FLAGS.workloads:
    rows, ratios = measure(name)
    print(f"\n{name}: product            count   XLA GFLOP/s  torch GFLOP/s  torch/XLA time")
    for r in rows:
      rate = lambda seconds: r["flops"] / seconds / 1e9
      print(f"    {r['label']:15} {r['kind']:8} {r['count']:3} {rate(r['xla_s']):13.1f} "
            f"{rate(r['torch_s']):14.1f} {r['torch_s'] / r['xla_s']:15.3f}")
    xla = sum(r["count"] * r["xla_s"] for r in rows)
    pt = sum(r["count"] * r["torch_s"] for r in rows)
    flops = sum(r["count"] * r["flops"] for r in rows)
    print(f"{name} per step: {flops / 1e9:.1f} GFLOP of products, XLA {xla * 1e3:.1f} ms "
          f"({flops / xla / 1e9:.1f} GFLOP/s), torch {pt * 1e3:.1f} ms ({flops / pt / 1e9:.1f} "
          f"GFLOP/s), medians of each product")
    mean, lo, hi = mean_ci95(ratios)
    print(f"{name} torch's products' time over XLA's, per round: mean {mean:.3f} [{lo:.3f}, "
          f"{hi:.3f}] (t 95%, {len(ratios)} rounds; {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
  cli.run(main)
