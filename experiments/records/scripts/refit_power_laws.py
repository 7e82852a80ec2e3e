"""Refit a published scaling fit's Kaplan L(N) and compute frontier L(C) from its run records.

  PYTHONPATH=. python experiments/records/scripts/refit_power_laws.py RECORDS_DIR RESULTS_DIR PREFIX

Until 2026-12-07 experiments.scaling.fit placed every run's loss curve at the summary's
non-embedding FLOPs even when the fit counted total FLOPs (its default), so the frontier's
alpha_C mixed two conventions, and neither alpha_N nor alpha_C had an interval. This refits
both as fit.py now does (curves in the fit's convention, 95% bootstrap intervals over the runs,
1000 resamples, seed 0) from the records of the runs the published fit used, and first checks
that those records are the right ones: alpha_N and the old alpha_C (recomputed the old way)
must come out as published. It then rewrites RESULTS_DIR/PREFIXfit.json's `kaplan` and
`frontier`, the two lines of PREFIXresults.md (with a dated note under its title) and
PREFIXfrontier.png where one exists. The other fits are untouched: nothing else reads the
curves or these two laws.
"""

import json
import os
import sys

import numpy as np

from experiments.scaling import fit, plots

records, results, prefix = sys.argv[1:4]
fit_path = os.path.join(results, f"{prefix}fit.json")
md_path = os.path.join(results, f"{prefix}results.md")
with open(fit_path) as f:
  result = json.load(f)
params, min_layers = result["params"], result.get("min_layers", 1)
all_runs = fit.load_runs(records, params)
keep = (all_runs["layers"] >= min_layers) | (all_runs["layers"] == 0)
runs = fit.select(all_runs, keep)
if len(runs["N"]) != result["num_runs"]:
  raise SystemExit(f"{records} holds {len(runs['N'])} runs at min_layers={min_layers}; "
                   f"{fit_path} fitted {result['num_runs']}")
kaplan = fit.fit_kaplan(runs["N"], runs["L"], bootstrap=1000, seed=0)
assert np.isclose(kaplan["alpha_N"], result["kaplan"]["alpha_N"], rtol=1e-9), (
    kaplan["alpha_N"], result["kaplan"]["alpha_N"])
curve_l = np.concatenate([c[:, 1] for c in runs["curves"]])
curve_run = np.concatenate([np.full(len(c), i) for i, c in enumerate(runs["curves"])])
old_c = np.concatenate([c[:, 0] * runs["C_non_embedding"][i] / runs["C"][i]
                        for i, c in enumerate(runs["curves"])])
old = fit.fit_frontier(old_c, curve_l)["alpha_C"]
assert np.isclose(old, result["frontier"]["alpha_C"], rtol=1e-9), (old,
                                                                    result["frontier"]["alpha_C"])
curve_c = np.concatenate([c[:, 0] for c in runs["curves"]])
frontier = fit.fit_frontier(curve_c, curve_l, run=curve_run, bootstrap=1000, seed=0)
frontier["metric"] = runs["curve_metric"]
result.update(kaplan=fit._json_safe(kaplan), frontier=fit._json_safe(frontier))
with open(fit_path, "w") as f:
  json.dump(result, f, indent=2)

new_lines = [line for line in fit.fit_markdown(result, records).splitlines()
             if line.startswith(("Kaplan L(N)", "Compute frontier", "(alpha_N and alpha_C"))]
with open(md_path) as f:
  lines = f.read().split("\n")
at = [i for i, line in enumerate(lines) if line.startswith(("Kaplan L(N)", "Compute frontier"))]
assert at == list(range(at[0], at[0] + 2)), at
lines[at[0]:at[-1] + 1] = new_lines
note = (f"Kaplan L(N) and the compute frontier refitted 2026-12-07 (`PYTHONPATH=. python "
        f"experiments/records/scripts/refit_power_laws.py {records} {results} {prefix or chr(39) * 2}`): "
        f"the frontier's curves now count FLOPs in the fit's {params} convention (they had the "
        f"non-embedding count: alpha_C {old:.3f} then, {frontier['alpha_C']:.3f} now), and "
        f"both exponents have 95% bootstrap intervals over the runs; nothing else changed.")
lines[1:1] = ["", note]
with open(md_path, "w") as f:
  f.write("\n".join(lines))
png = os.path.join(results, f"{prefix}frontier.png")
if os.path.exists(png):
  plots.plot_frontier(png, dict(runs, params=params), kaplan, frontier)
print(f"{md_path}: alpha_N {kaplan['alpha_N']:.3f} {np.round(kaplan['ci']['alpha_N'], 3)}, "
      f"alpha_C {old:.3f} -> {frontier['alpha_C']:.3f} {np.round(frontier['ci']['alpha_C'], 3)}")
