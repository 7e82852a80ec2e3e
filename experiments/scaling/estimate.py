r"""CPU-time estimate of a sweep design from a short timing run at two sizes and two batches.

  python -m experiments.scaling.estimate --config configs/scaling.py:design=corrected \
      --config.sweep.lr_law=0.01,-0.2          # any lr law: the estimate ignores the lr
  python -m experiments.scaling.estimate --measure   # re-time this machine (about a minute)

Model of one run's wall time, one run at a time on the whole machine (--parallel 1):
  overhead + train_tokens / rate(N, batch) + eval_tokens * evals / (EVAL_SPEEDUP * rate)
with log rate linear in log N_total and log batch, fitted to TIMING (tokens/s of 60-step
`transformer.train` runs of configs/lm.py; the last logged window, so compilation is out),
and `overhead` the measured wall time less the training time (start-up, compile, unigram
entropy, checkpoints). Evaluation is forward only (~1/3 of a training step's FLOPs).
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

# Measured 2026-12-01 on this 2-core machine, one run at a time (tokens/s, wall seconds of
# 60 steps of seq_len 128 including start-up), via `--measure`.
TIMING = [
    dict(d_model=32, num_layers=2, num_heads=2, head_dim=16, params_total=33056, batch=8,
         tokens_per_s=106.9e3, wall_s=18.9),
    dict(d_model=32, num_layers=2, num_heads=2, head_dim=16, params_total=33056, batch=32,
         tokens_per_s=149.5e3, wall_s=8.4),
    dict(d_model=128, num_layers=4, num_heads=4, head_dim=32, params_total=820864, batch=8,
         tokens_per_s=17.8e3, wall_s=12.1),
    dict(d_model=128, num_layers=4, num_heads=4, head_dim=32, params_total=820864, batch=32,
         tokens_per_s=25.6e3, wall_s=19.9),
]
STEPS = 60
EVAL_SPEEDUP = 2.5  # forward only is ~3x cheaper; a little less on a CPU
EVAL_CALLS = 4  # evaluations per run (sweep.eval_points) when the design does not say


def rate_model(timing=TIMING):
  """(coefficients, overhead_s) of log rate = c0 + c1 log N + c2 log batch."""
  x = np.array([[1.0, np.log(t["params_total"]), np.log(t["batch"])] for t in timing])
  y = np.log([t["tokens_per_s"] for t in timing])
  coef = np.linalg.lstsq(x, y, rcond=None)[0]
  overhead = [t["wall_s"] - STEPS * t["batch"] * 128 / t["tokens_per_s"] for t in timing]
  return coef, float(np.median(overhead))


def run_seconds(run: dict, seq_len: int, coef, overhead: float, eval_points: int) -> float:
  o = run["overrides"]
  batch = o.get("train.batch_size", run.get("batch_size"))
  rate = float(np.exp(coef @ [1.0, np.log(run["params_total"]), np.log(batch)]))
  evals = min(eval_points, o["train.steps"]) + 1
  eval_tokens = o.get("train.eval_batches", 8) * batch * seq_len * evals
  return overhead + run["tokens"] / rate + eval_tokens / (EVAL_SPEEDUP * rate)


def estimate(config) -> dict:
  from launch import sweep
  runs = sweep.expand(config)
  coef, overhead = rate_model()
  points = config.sweep.get("eval_points", EVAL_CALLS)
  seconds = [run_seconds(r, config.data.seq_len, coef, overhead, points) for r in runs]
  by_budget = {}
  for r, s in zip(runs, seconds):
    key = r.get("budget") or "-"
    by_budget[key] = by_budget.get(key, 0.0) + s
  return dict(runs=len(runs), hours=sum(seconds) / 3600,
              flops_total=sum(r["flops_total"] for r in runs),
              by_budget_hours={str(k): v / 3600 for k, v in by_budget.items()},
              rate_coefficients=coef.tolist(), overhead_s=overhead)


def measure() -> list[dict]:
  """Re-time the four TIMING points with the real trainer (about a minute on 2 cores)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = []
  for t in TIMING:
    with tempfile.TemporaryDirectory() as workdir:
      import time
      start = time.time()
      flags = dict(d_model=t["d_model"], num_layers=t["num_layers"], num_heads=t["num_heads"],
                   head_dim=t["head_dim"], d_ff=4 * t["d_model"])
      cmd = [sys.executable, "-m", "transformer.train", "--config=configs/lm.py",
             f"--workdir={workdir}", *(f"--config.model.{k}={v}" for k, v in flags.items()),
             f"--config.train.steps={STEPS}", f"--config.train.batch_size={t['batch']}",
             "--config.train.log_every=20", f"--config.train.eval_every={STEPS}",
             f"--config.train.checkpoint_every={STEPS}", "--config.train.eval_batches=4"]
      subprocess.run(cmd, cwd=root, check=True, capture_output=True)
      wall = time.time() - start
      from transformer.training import metrics_file
      rows = metrics_file.read(os.path.join(workdir, "metrics.jsonl"))
      out.append(dict(t, tokens_per_s=rows[-1]["tokens_per_s"], wall_s=wall))
  return out


def main(argv):
  del argv
  from absl import flags
  from transformer import cli
  f = flags.FLAGS
  if f.measure:
    print(json.dumps(measure(), indent=1))
    return
  if not f["config"].present:
    raise SystemExit("error: --config is required (e.g. --config "
                     "configs/scaling.py:design=corrected), or --measure to time this machine")
  result = estimate(cli.config(f["config"]))
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  from absl import flags
  from ml_collections import config_flags
  from transformer import cli
  config_flags.DEFINE_config_file("config", None, "Sweep config file[:args].")
  flags.DEFINE_bool("measure", False, "Time this machine instead (prints TIMING rows).")
  cli.run(main)
