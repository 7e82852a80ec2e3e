"""Which budgets approach 2's bootstrap resamples fit their power law on, for a deep grid.

  PYTHONPATH=. python experiments/records/scripts/approach2_budget_sets.py [GRID ...]

fit_isoflop_local refits every resample's power law on the budgets whose minimum that
resample brackets, which need not be the point estimate's. This replays its bootstrap (the
same generator, seed 0, 1000 resamples, the published --min_layers=3 selection) on the run
records of each GRID (default: extended_deep_window extended_deep) and prints how many
resamples used each budget set, and the interval of a over the resamples that used the point
estimate's budgets, beside the published one over all of them.
"""

import collections
import math
import sys

import numpy as np

from experiments.scaling import approach2, fit
from experiments.scaling.power_laws import interval

for grid in sys.argv[1:] or ["extended_deep_window", "extended_deep"]:
  runs = fit.load_runs(f"experiments/records/scaling/grammar_corpus/{grid}", "total")
  runs = fit.select(runs, runs["layers"] >= 3)
  budget, N, L = runs["budget"], runs["N_total"], runs["L"]
  logd, logc = np.log10(runs["D"]), np.log10(runs["C_total"])
  out = fit.fit_isoflop_local(budget, N, L, runs["D"], runs["C_total"], bootstrap=1000, seed=0)
  noise = approach2.seed_noise(budget, N, L)
  rng = np.random.default_rng(0)  # as fit_isoflop_local draws them, in the same order
  sets, same = collections.Counter(), []
  for _ in range(1000):
    sd = noise["sigma"] * math.sqrt(noise["dof"] / rng.chisquare(noise["dof"]))
    resample = np.maximum(L + rng.normal(0, sd, len(L)), 1e-9)
    laws = approach2._power_laws(approach2._isoflop_local_once(budget, N, resample, logd, logc, 5))
    sets[", ".join(f"{c:.0e}" for c in laws["power_law_budgets"])] += 1
    if laws["power_law_budgets"] == out["power_law_budgets"]:
      same.append(laws.get("a", math.nan))
  lo, hi = out["ci"]["a"]
  print(f"{grid}: a = {out['a']:.3f} [{lo:.3f}, {hi:.3f}] over the budgets "
        f"{', '.join(f'{c:.0e}' for c in out['power_law_budgets'])}")
  for key, count in sets.most_common():
    print(f"  {count:4d} resamples fit the budgets {key}")
  lo, hi = interval(same)
  print(f"  over the {len(same)} with the point estimate's budgets: [{lo:.3f}, {hi:.3f}]")
