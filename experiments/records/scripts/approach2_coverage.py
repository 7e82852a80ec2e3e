"""Coverage of approach 2's bootstrap interval of a, as published and with a fixed budget set.

  PYTHONPATH=. python experiments/records/scripts/approach2_coverage.py GRID [GRIDS [RESAMPLES]]

fit_isoflop_local bootstraps the whole approach-2 procedure: each resample (the runs' losses
plus seed noise) picks the budgets whose minimum it brackets and fits its power law on those, as
the point estimate did on the data. An interval so made is the procedure's, selection included,
and its resamples fit budget sets other than the point estimate's (approach2_budget_sets.py).
The alternative holds the point estimate's budgets fixed in every resample; a resample in which
one of them has no minimum (its parabola opens downward) then has no a, and is either left out
or counted beyond both ends of the interval.

This measures which of the three covers. On GRID's run records
(experiments/records/scaling/grammar_corpus/GRID, its published --min_layers) it prints the
three intervals; then it draws GRIDS synthetic grids (default 300) at GRID's design, the losses
from GRID's approach-3 law plus Gaussian noise of its pooled seed sd, and counts how often each
interval (RESAMPLES resamples each, default 300) holds the truth: approach 2 on the noiseless
law over the budgets that grid's point estimate used.
"""

import json
import math
import sys

import numpy as np

from experiments.scaling import approach2, fit
from experiments.scaling.power_laws import CI_PERCENTILES, interval, power_law

METHODS = ("published (budgets re-selected per resample)", "fixed budgets, failures left out",
           "fixed budgets, failures beyond both ends")


def beyond_both_ends(values):
  values = np.asarray(values, float)
  finite, failed = values[np.isfinite(values)], int((~np.isfinite(values)).sum())
  far = np.full(failed, 1e300)
  lo = np.percentile(np.concatenate([-far, finite]), CI_PERCENTILES[0])
  hi = np.percentile(np.concatenate([finite, far]), CI_PERCENTILES[1])
  return [lo if lo > -1e200 else -math.inf, hi if hi < 1e200 else math.inf]


def a_over(curves, budgets):
  use = [k for k in curves if k["C"] in budgets and "N_opt" in k]
  if len(use) < max(2, len(budgets)):
    return math.nan
  return power_law([k.get("C_opt", k["C"]) for k in use], [k["N_opt"] for k in use])[0]


def intervals(budget, N, L, logd, logc, resamples, seed):
  """(point estimate's budgets, a, [interval per METHODS]), drawing resamples as
  fit_isoflop_local does (the seed sd redrawn from its chi-square, then noise per run)."""
  point = approach2._power_laws(approach2._isoflop_local_once(budget, N, L, logd, logc, 5))
  noise = approach2.seed_noise(budget, N, L)
  rng = np.random.default_rng(seed)
  selected, fixed = [], []
  for _ in range(resamples):
    sd = noise["sigma"] * math.sqrt(noise["dof"] / rng.chisquare(noise["dof"]))
    curves = approach2._isoflop_local_once(
        budget, N, np.maximum(L + rng.normal(0, sd, len(L)), 1e-9), logd, logc, 5)
    selected.append(approach2._power_laws(curves).get("a", math.nan))
    fixed.append(a_over(curves, point["power_law_budgets"]))
  return point["power_law_budgets"], point.get("a"), [
      interval(selected), interval(fixed), beyond_both_ends(fixed)], float(
          np.mean(~np.isfinite(fixed)))


def main(grid, grids=300, resamples=300):
  path = "experiments/scaling/results/grammar_corpus"
  with open(f"{path}/{grid}_fit.json") as f:
    published = json.load(f)
  runs = fit.load_runs(f"experiments/records/scaling/grammar_corpus/{grid}", "total")
  runs = fit.select(runs, runs["layers"] >= published.get("min_layers", 1))
  budget, N, D, C = runs["budget"], runs["N_total"], runs["D"], runs["C_total"]
  logd, logc = np.log10(D), np.log10(C)
  used, a, cis, real_failed = intervals(budget, N, runs["L"], logd, logc, 1000, 0)
  if not np.allclose(cis[0], published["isoflop"]["ci"]["a"], rtol=1e-9):
    raise SystemExit(f"the replayed interval {cis[0]} is not the published "
                     f"{published['isoflop']['ci']['a']}")
  print(f"{grid} ({len(N)} runs): a = {a:.3f} over {', '.join(f'{c:.0e}' for c in used)}; 1000 "
        f"resamples, seed 0:")
  for name, ci in zip(METHODS, cis):
    print(f"  {name}: [{ci[0]:.3f}, {ci[1]:.3f}]")
  print(f"  resamples in which a budget of the estimate has no minimum: {real_failed:.1%}")
  law = {k: published["chinchilla"][k] for k in ("E", "A", "B", "alpha", "beta")}
  mean = law["E"] + law["A"] / N ** law["alpha"] + law["B"] / D ** law["beta"]
  clean = approach2._isoflop_local_once(budget, N, mean, logd, logc, 5)
  sigma = published["isoflop"]["seed_noise"]["sigma"]
  rng = np.random.default_rng(123)
  hits, widths, unbounded, drawn = np.zeros(3), [[], [], []], np.zeros(3), 0
  # Grids whose resamples lose a budget's minimum as often as the data's do (at least half
  # the data's rate): whether the coverage holds where the data sit, not only on average.
  like_data, like_hits, failed_rates = 0, np.zeros(3), []
  for g in range(grids):
    used, a, cis, failed = intervals(budget, N, mean + rng.normal(0, sigma, len(N)), logd,
                                     logc, resamples, g)
    truth = a_over(clean, used)
    if a is None or not np.isfinite(truth):
      continue
    drawn += 1
    failed_rates.append(failed)
    similar = failed >= real_failed / 2
    like_data += similar
    for i, (lo, hi) in enumerate(cis):
      hits[i] += lo <= truth <= hi
      like_hits[i] += similar and lo <= truth <= hi
      widths[i].append(hi - lo)
      unbounded[i] += not np.isfinite(hi - lo)
  print(f"  {drawn} of {grids} synthetic grids with an estimate (law E={law['E']:.3f}, "
        f"alpha={law['alpha']:.3f}, beta={law['beta']:.3f}; noise sd {sigma:.4f}; "
        f"{resamples} resamples each): coverage, median width, unbounded")
  for i, name in enumerate(METHODS):
    print(f"  {name}: {int(hits[i])}/{drawn} = {hits[i] / drawn:.3f}, "
          f"{np.median(widths[i]):.3f}, {int(unbounded[i])}")
  print(f"  resamples without a minimum at a budget of the estimate, per grid: median "
        f"{np.median(failed_rates):.1%}, 90th percentile {np.percentile(failed_rates, 90):.1%}; "
        f"{like_data} grids at >= {real_failed / 2:.1%} (half the data's rate), coverage there: "
        + ", ".join(f"{int(h)}/{like_data}" for h in like_hits) + " (in the order above)")


if __name__ == "__main__":
  main(sys.argv[1], *map(int, sys.argv[2:4]))
