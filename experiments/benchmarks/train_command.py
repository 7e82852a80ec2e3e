r"""The train command against its own bare step, and where its memory goes, on W1/W2.

    python -m experiments.benchmarks.train_command [--workloads W1,W2] [--train_steps 40]
        [--cpu_devices 1] [--torch] [--torch_compile] [--repeats 3]

For each workload of experiments/benchmarks/train_throughput.py, in separate processes run one
after another (so each peak resident set is its own):
  bare    train_throughput: the jitted step on one random batch, no data, logging or saving
  train   `python -m transformer.train` with configs/lm.py set to the same shape (grammar
          corpus bytes, vocabulary 256 + the tokenizer's specials, learned positions, GELU,
          AdamW), --train_steps steps, logging every 5, one eval and one save at the end
  torch   (--torch) train_throughput_torch, the PyTorch implementation of the same model
  compiled (--torch_compile) the same with torch.compile (inductor), PyTorch's fastest CPU
          path; with both, "best/train" compares the train command with the faster of the two
          in each round
Step time of `train` is the median step_time_s of its metrics.jsonl rows after the first
(which holds the warm-up); eval and checkpoint time are outside it, as the progress line shows.
Each row is the mean of 5 steps, so `bare` and `torch` time as many steps as those rows hold
(--train_steps - 5, after their own warm-up) and report the median of their 5-step means
(train_throughput's --window): one estimator for all three. A median of single steps sits
below a median of 5-step means wherever a slow step comes now and then, which had counted
against the train command (docs/performance.md).
Memory: each process's peak resident set (wait4's ru_maxrss) and, for `train`, the resident
set sampled every 20 ms and attributed to the phase the run had printed last (start-up and
data, unigram entropy and loss floor, compile, steps, eval, save), so the table says which
phase sets the peak. Both commands get the same --cpu_devices (the train command's default 1:
one XLA device using every core).

--repeats R runs the R rounds interleaved (bare, train, torch, then again), because a VM's
speed drifts by more than the effects measured here between runs minutes apart: each round is
a row, and a last row per workload holds the medians over rounds, with the ratios' range and
each ratio's mean over rounds with its t 95% interval (the rounds are the unit: the same
program's step time moves more from process to process than within one).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import flags

from transformer import cli
from experiments.benchmarks.intervals import mean_ci95
from experiments.benchmarks.train_throughput import WORKLOADS

# train_throughput's flags (--workloads, --cpu_devices, ...) come with its import; the train
# command's default is one XLA device using every core, so that is this benchmark's too.
FLAGS = flags.FLAGS
FLAGS.set_default("cpu_devices", 1)
_STEPS = flags.DEFINE_integer("train_steps", 40, "Train-command steps per workload.")
_TORCH = flags.DEFINE_bool("torch", False, "Also run the PyTorch implementation (interop extra).")
_TORCH_COMPILE = flags.DEFINE_bool("torch_compile", False, "Also run the PyTorch implementation "
                                   "under torch.compile (interop extra and a C++ compiler).")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Interleaved rounds per workload (medians reported).")

# The train command logs each window's mean step time; the bare steps are summarized the same
# way over as many steps as the windows it reports (all but the first, which holds the warm-up).
_LOG_EVERY = 5

# The phase a train run is in, from the last line it printed that matches (first match wins).
_PHASES = (("done:", "end"), ("| eval", "save"), ("step ", "steps and eval"), ("compiled", "steps and eval"),
           ("loss floor", "compile"), ("unigram entropy", "floor"), ("params", "entropy"))


def _rss_mib(pid: int) -> float:
  try:
    with open(f"/proc/{pid}/status") as f:
      return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
  except (OSError, StopIteration):
    return 0.0


def run(command: list[str]) -> tuple[str, float, dict]:
  """Runs command; returns its output, peak RSS (MiB) and the peak RSS seen in each phase."""
  process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
  lines, phase, peaks = [], ["start-up"], {}

  def sample():
    while process.poll() is None:
      peaks[phase[0]] = max(peaks.get(phase[0], 0.0), _rss_mib(process.pid))
      time.sleep(0.02)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  for line in process.stdout:
    lines.append(line)
    phase[0] = next((name for key, name in _PHASES if key in line), phase[0])
  _, status, usage = os.wait4(process.pid, 0)
  process.returncode = os.waitstatus_to_exitcode(status)
  sampler.join()
  output = "".join(lines)
  if process.returncode:
    raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}):\n{output[-3000:]}")
  return output, usage.ru_maxrss / 1024, peaks


def train_command(name: str, workdir: str) -> list[str]:
  w = WORKLOADS[name]
  model = w["model"]
  return [sys.executable, "-m", "transformer.train", "--config", "configs/lm.py",
          "--workdir", workdir, f"--cpu_devices={FLAGS.cpu_devices}",
          f"--config.model.d_model={model['d_model']}",
          f"--config.model.num_layers={model['num_layers']}",
          f"--config.model.num_heads={model['num_heads']}",
          f"--config.model.head_dim={model['d_model'] // model['num_heads']}",
          f"--config.model.d_ff={model['d_ff']}", "--config.model.ffn=gelu",
          "--config.model.position.name=learned", f"--config.model.max_len={w['seq_len']}",
          f"--config.data.seq_len={w['seq_len']}", f"--config.train.batch_size={w['batch_size']}",
          f"--config.train.steps={_STEPS.value}", f"--config.train.log_every={_LOG_EVERY}",
          f"--config.train.eval_every={_STEPS.value}",
          f"--config.train.checkpoint_every={_STEPS.value}", "--config.opt.name=adamw"]


def measure(name: str) -> dict:
  same_steps = [f"--steps={_STEPS.value - _LOG_EVERY}", f"--window={_LOG_EVERY}"]
  bare_out, bare_rss, _ = run([sys.executable, "-m", "experiments.benchmarks.train_throughput",
                               f"--workloads={name}", f"--cpu_devices={FLAGS.cpu_devices}",
                               *same_steps])
  bare_ms = float(re.search(rf"^{name}\s+([\d.]+)", bare_out, re.M).group(1))
  with tempfile.TemporaryDirectory() as tmp:
    workdir = os.path.join(tmp, name)
    _, train_rss, phases = run(train_command(name, workdir))
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  step_times = [r["step_time_s"] for r in rows[1:] if "step_time_s" in r]
  result = dict(workload=name, bare_ms=bare_ms, train_ms=statistics.median(step_times) * 1e3,
                bare_rss=bare_rss, train_rss=train_rss, phases=phases)
  for key in _torch_runs():
    out, rss, _ = run([sys.executable, "-m", "experiments.benchmarks.train_throughput_torch",
                       f"--workloads={name}", *same_steps, f"--compile={key == 'compiled'}"])
    result.update({f"{key}_ms": float(re.search(rf"^{name}\s+([\d.]+)", out, re.M).group(1)),
                   f"{key}_rss": rss})
  return result


def _torch_runs() -> list[str]:
  """The PyTorch runs asked for: eager ("torch") and/or torch.compile ("compiled")."""
  return [key for key, wanted in (("torch", _TORCH.value), ("compiled", _TORCH_COMPILE.value))
          if wanted]


def median_row(rounds: list[dict]) -> dict:
  """The medians over rounds of every figure, the range of the per-round ratios and their
  means with t 95% intervals."""
  keys = [k for k in rounds[0] if isinstance(rounds[0][k], float)]
  row = {k: statistics.median(r[k] for r in rounds) for k in keys}
  row.update(workload=rounds[0]["workload"], phases=rounds[-1]["phases"],
             label=f"{rounds[0]['workload']} median of {len(rounds)}")
  ratios = {"train/bare": [r["train_ms"] / r["bare_ms"] for r in rounds]}
  for key in ("torch", "compiled"):
    if f"{key}_ms" in row:
      ratios[f"{key}/train"] = [r[f"{key}_ms"] / r["train_ms"] for r in rounds]
      ratios[f"train/{key} MiB"] = [r["train_rss"] / r[f"{key}_rss"] for r in rounds]
  if "torch_ms" in row and "compiled_ms" in row:
    ratios["best/train"] = [min(r["torch_ms"], r["compiled_ms"]) / r["train_ms"] for r in rounds]
  row["ranges"] = {k: (min(v), max(v)) for k, v in ratios.items()}
  row["means"] = {k: mean_ci95(v) for k, v in ratios.items()}
  return row


def main(argv):
  del argv
  for name in FLAGS.workloads:
    if name not in WORKLOADS:
      raise ValueError(f"unknown workload {name!r}; valid: {sorted(WORKLOADS)}")
  if _STEPS.value < 2 * _LOG_EVERY or _STEPS.value % _LOG_EVERY:
    raise ValueError(f"--train_steps={_STEPS.value}: give a multiple of {_LOG_EVERY}, at least "
                     f"{2 * _LOG_EVERY} (the first {_LOG_EVERY}-step window holds the warm-up)")
  if _REPEATS.value < 1:
    raise ValueError(f"--repeats={_REPEATS.value}: give 1 or more rounds")
  print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"--cpu_devices={FLAGS.cpu_devices}, {_STEPS.value} train-command steps, "
        f"{_REPEATS.value} round(s)")
  rows, summaries = [], []
  for name in FLAGS.workloads:
    rounds = []
    for i in range(_REPEATS.value):
      rounds.append(dict(measure(name), label=f"{name}" + (f" #{i + 1}" if _REPEATS.value > 1
                                                              else "")))
    rows += rounds
    if _REPEATS.value > 1:
      summaries.append(median_row(rounds))
      rows.append(summaries[-1])
  torch = "".join(f" {key + ' ms':>11} {key + ' MiB':>12} {key + '/train':>14}"
                  for key in _torch_runs())
  print(f"{'':14} {'bare ms':>8} {'train ms':>8} {'train/bare':>10} {'bare MiB':>9} "
        f"{'train MiB':>9}{torch}")
  for r in rows:
    extra = "".join(f" {r[key + '_ms']:11.1f} {r[key + '_rss']:12.0f} "
                    f"{r[key + '_ms'] / r['train_ms']:14.3f}" for key in _torch_runs())
    print(f"{r['label']:14} {r['bare_ms']:8.1f} {r['train_ms']:8.1f} "
          f"{r['train_ms'] / r['bare_ms']:10.3f} {r['bare_rss']:9.0f} {r['train_rss']:9.0f}{extra}")
  for r in summaries:
    print(f"{r['workload']} over {_REPEATS.value} rounds, range of the per-round ratios: " +
          ", ".join(f"{k} {lo:.3f}-{hi:.3f}" for k, (lo, hi) in r["ranges"].items()))
    print(f"{r['workload']} over {_REPEATS.value} rounds, mean of the per-round ratios with its "
          "t 95% interval: " + ", ".join(f"{k} {m:.3f} [{lo:.3f}, {hi:.3f}]"
                                          for k, (m, lo, hi) in r["means"].items()))
  for r in [x for x in rows if "ranges" not in x]:
    print(f"{r['label']} train-command peak RSS by phase (MiB): " + ", ".join(
        f"{phase} {mib:.0f}" for phase, mib in r["phases"].items()))
  print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
  cli.run(main)
