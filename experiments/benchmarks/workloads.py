"""The training benchmarks' workloads and step-time summary, with no jax import.

train_throughput.py (jax) and train_throughput_torch.py (PyTorch) share them; the PyTorch
process must not load jax and XLA (about 200 MiB), or its peak resident memory, which
train_command.py compares with the train command's, would count a framework it never uses.
"""

import statistics

from absl import flags

WORKLOADS_FLAG = flags.DEFINE_list("workloads", ["W1", "W2"], "Workloads to run.")
STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per workload (median reported).")
WINDOW = flags.DEFINE_integer(
    "window", 1, "Report the median over the means of consecutive windows of this many timed "
    "steps (1: the median step), to match a train run that logs every `window` steps.")
PEAK_N = flags.DEFINE_integer("peak_n", 2048, "Matrix size of the fp32 matmul peak measurement.")

WORKLOADS = {
    "W1": dict(model=dict(d_model=256, num_layers=4, num_heads=4, d_ff=1024),
               seq_len=256, batch_size=16),
    "W2": dict(model=dict(d_model=512, num_layers=8, num_heads=8, d_ff=2048),
               seq_len=512, batch_size=8),
}


def check_window(window: int, steps: int) -> None:
  if not 1 <= window <= steps:
    raise ValueError(f"--window={window}: give 1 .. --steps ({steps}) steps per window")


def window_median(times: list[float], window: int) -> float:
  """The median over the means of consecutive `window`-step windows (a trailing part window
  is left out): the train command logs each window's mean step time, and on a right-skewed
  distribution (a slow step now and then) a mean of a few steps sits above the median step,
  so a bare step has to be summarized the same way to compare with it."""
  check_window(window, len(times))
  means = [statistics.fmean(times[i:i + window])
           for i in range(0, len(times) - window + 1, window)]
  return statistics.median(means)
