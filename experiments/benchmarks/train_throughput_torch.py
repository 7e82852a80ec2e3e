r"""The train_throughput workloads in PyTorch: what an eager framework reaches on this CPU.

    python -m experiments.benchmarks.train_throughput_torch [--workloads W1,W2] [--steps 10]
        [--compile]

Needs the interop extra (torch). The model is the one experiments/benchmarks/train_throughput.py
builds with jax (pre-RMSNorm decoder, no biases, learned positions, exact GELU, tied
embeddings), trained on the same random byte tokens with torch.optim.AdamW; attention is
F.scaled_dot_product_attention with is_causal (PyTorch's fused CPU kernel). FLOPs per token
and the peak (best of five fp32 2048^3 torch.mm, before and after the workloads) follow the
jax benchmark, so the two "of peak" columns compare directly.

--compile runs the model and loss through torch.compile (inductor, which generates C++ for the
CPU and needs a compiler on the PATH; its backward pass is compiled too, AdamW stays eager), so
the comparison can be with PyTorch's fastest CPU training path, not only with eager mode. The
compile happens in the two warm-up steps, outside the timed ones.
"""

import os
import statistics
import time

import torch
import torch.nn.functional as F
from absl import flags

from transformer import cli

# train_throughput's workloads and flags (--workloads, --steps, --window, --peak_n), so both
# runs are one recipe; from a module without jax, which this process must not load.
from experiments.benchmarks.workloads import WORKLOADS, check_window, window_median

FLAGS = flags.FLAGS
_THREADS = flags.DEFINE_integer("threads", 0, "torch intra-op threads (0: all CPUs). Compare "
                                "with jax at one thread: XLA_FLAGS='--xla_cpu_multi_thread_eigen"
                                "=false intra_op_parallelism_threads=1'.")
_COMPILE = flags.DEFINE_bool("compile", False, "torch.compile the model and loss (inductor).")


class Block(torch.nn.Module):

  def __init__(self, d, heads, d_ff):
    super().__init__()
    self.heads = heads
    self.norm1, self.norm2 = torch.nn.RMSNorm(d, eps=1e-6), torch.nn.RMSNorm(d, eps=1e-6)
    self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
    self.out = torch.nn.Linear(d, d, bias=False)
    self.up = torch.nn.Linear(d, d_ff, bias=False)
    self.down = torch.nn.Linear(d_ff, d, bias=False)

  def forward(self, x_BLD):
    B, L, D = x_BLD.shape
    q, k, v = self.qkv(self.norm1(x_BLD)).view(B, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
    y_BHLK = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x_BLD = x_BLD + self.out(y_BHLK.transpose(1, 2).reshape(B, L, D))
    return x_BLD + self.down(F.gelu(self.up(self.norm2(x_BLD))))


class Decoder(torch.nn.Module):

  def __init__(self, vocab, d_model, num_layers, num_heads, d_ff, max_len):
    super().__init__()
    self.embed = torch.nn.Embedding(vocab, d_model)
    self.pos = torch.nn.Embedding(max_len, d_model)
    self.blocks = torch.nn.ModuleList(Block(d_model, num_heads, d_ff)
                                      for _ in range(num_layers))
    self.norm = torch.nn.RMSNorm(d_model, eps=1e-6)

  def forward(self, tokens_BL):
    x_BLD = self.embed(tokens_BL) + self.pos.weight[:tokens_BL.shape[1]]
    for block in self.blocks:
      x_BLD = block(x_BLD)
    return self.norm(x_BLD) @ self.embed.weight.T


def matmul_peak(n: int, repeats: int = 5) -> float:
  a, b = torch.randn(n, n), torch.randn(n, n)
  torch.mm(a, b)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    torch.mm(a, b)
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best


def measure(name: str) -> dict:
  w = WORKLOADS[name]
  m, B, L = w["model"], w["batch_size"], w["seq_len"]
  torch.manual_seed(0)
  model = Decoder(256, m["d_model"], m["num_layers"], m["num_heads"], m["d_ff"], L)
  decay = [p for n, p in model.named_parameters() if "norm" not in n]
  no_decay = [p for n, p in model.named_parameters() if "norm" in n]
  opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=1e-3, weight_decay=0.1, foreach=True)
  tokens = torch.randint(0, 256, (B, L + 1), generator=torch.Generator().manual_seed(0))
  inputs, targets = tokens[:, :-1], tokens[:, 1:]

  def forward():
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

  if _COMPILE.value:
    forward = torch.compile(forward)

  def step():
    opt.zero_grad(set_to_none=True)
    loss = forward()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss

  start = time.perf_counter()
  for _ in range(2):
    step()
  warm_up_s = time.perf_counter() - start
  times, cpu_times = [], []
  for _ in range(FLAGS.steps):
    start, cpu_start = time.perf_counter(), time.process_time()
    loss = step()
    times.append(time.perf_counter() - start)
    cpu_times.append(time.process_time() - cpu_start)
  d, layers = m["d_model"], m["num_layers"]
  non_embedding = sum(p.numel() for p in model.blocks.parameters()) + d
  flops_per_token = 6 * non_embedding + 6 * layers * L * d
  step_s = window_median(times, FLAGS.window)
  return dict(workload=name, step_ms=step_s * 1e3, cpu_ms=statistics.median(cpu_times) * 1e3,
              tokens_per_s=B * L / step_s, gflops=flops_per_token * B * L / step_s / 1e9,
              warm_up_s=warm_up_s, loss=float(loss.detach()))


def main(argv):
  del argv
  for name in FLAGS.workloads:
    if name not in WORKLOADS:
      raise ValueError(f"unknown workload {name!r}; valid: {sorted(WORKLOADS)}")
  check_window(FLAGS.window, FLAGS.steps)
  torch.set_num_threads(_THREADS.value or os.cpu_count())
  print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{'torch.compile (inductor)' if _COMPILE.value else 'eager'}; "
        f"load average {os.getloadavg()[0]:.1f}")
  peak_before = matmul_peak(FLAGS.peak_n)
  results = [measure(name) for name in FLAGS.workloads]
  peak = max(peak_before, matmul_peak(FLAGS.peak_n))
  print(f"fp32 torch.mm peak ({FLAGS.peak_n}^3, best of 5): {peak / 1e9:.1f} GFLOP/s")
  print(f"{'':4} {'step ms':>8} {'cpu ms':>7} {'tokens/s':>9} {'GFLOP/s':>8} {'of peak':>8} "
        f"{'warm-up s':>9}")
  for r in results:
    print(f"{r['workload']:4} {r['step_ms']:8.1f} {r['cpu_ms']:7.0f} {r['tokens_per_s']:9.0f} "
          f"{r['gflops']:8.1f} {r['gflops'] * 1e9 / peak:8.1%} {r['warm_up_s']:9.1f}")


if __name__ == "__main__":
  cli.run(main)
