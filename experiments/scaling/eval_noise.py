"""How much a grid's evaluation loss moves between consecutive evaluations of a run: the
noise an IsoFLOP curve's final losses carry, which one seed per point cannot average out.

    python -m experiments.scaling.eval_noise runs/scaling_a runs/scaling_b ...

Per grid (the finished runs in its N=... directories): the final evaluation minus the one
before it, and |change| between consecutive evaluations over the last half of each run.
"""

import glob
import json
import os
import sys

import numpy as np


def eval_losses(run_dir: str) -> np.ndarray:
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return np.array([r["eval_loss"] for r in map(json.loads, f) if "eval_loss" in r])


def grid_noise(grid: str) -> dict:
  finals, swings = [], []
  for run_dir in sorted(glob.glob(os.path.join(grid, "N=*"))):
    if not os.path.exists(os.path.join(run_dir, "summary.json")):
      continue  # unfinished
    loss = eval_losses(run_dir)
    if len(loss) < 2:
      continue
    finals.append(loss[-1] - loss[-2])
    swings.extend(np.abs(np.diff(loss[len(loss) // 2:])))
  if not finals:
    raise ValueError(f"{grid}: no finished run with two evaluations (N=*/metrics.jsonl)")
  finals, swings = np.array(finals), np.array(swings)
  return {"runs": len(finals), "final_minus_previous_median": float(np.median(finals)),
          "final_minus_previous_max_abs": float(np.abs(finals).max()),
          "final_jumps_over_0.05": int(np.sum(np.abs(finals) > 0.05)),
          "swing_median": float(np.median(swings)),
          "swing_p90": float(np.percentile(swings, 90)), "swing_max": float(swings.max())}


def main(grids) -> None:
  if not grids or {"-h", "--help"} & set(grids):
    raise SystemExit(__doc__)
  try:  # every grid read before the table starts, so a bad one is one line and no table
    noise = {grid: grid_noise(grid) for grid in grids}
  except (OSError, ValueError) as e:
    raise SystemExit(f"error: {e}") from None
  print("| grid | runs | final - previous: median | max abs | abs > 0.05 "
        "| consecutive abs change, last half: median | 90th pct | max |")
  print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  for grid, n in noise.items():
    print(f"| {grid} | {n['runs']} | {n['final_minus_previous_median']:+.3f} "
          f"| {n['final_minus_previous_max_abs']:.3f} | {n['final_jumps_over_0.05']} "
          f"| {n['swing_median']:.3f} | {n['swing_p90']:.3f} | {n['swing_max']:.3f} |")


if __name__ == "__main__":
  main(sys.argv[1:])
