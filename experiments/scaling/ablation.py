r"""Which of Porian et al.'s corrections moves a, and by how much: one table over the grids.

  python -m experiments.scaling.ablation --out experiments/scaling/results/grammar_corpus \
      runs/scaling_ablation runs/scaling_ablation_flops runs/scaling_ablation_warmup \
      runs/scaling_corrected

Each DIR is a finished sweep (configs/scaling.py designs ablation, ablation_flops,
ablation_warmup, corrected: each adds one correction to the one before). Every grid is fitted
with approach 2 (local parabolas, seed-noise bootstrap) and approach 3 (E free), on the
budgets all grids share, in the parameter convention the step counts (the original grid: non-
embedding N, as Kaplan; the others: total N); the table gives a with its interval and the
change from the row above. The first row is also refitted with total N, which separates
the counting of the output layer from the step counts it changes. Writes ablation.md and
ablation.json in --out.
"""

import json
import os

import numpy as np

from experiments.scaling import fit

STEPS = {"non_embedding": "original: lr 3e-3, warmup 50, beta2 0.95, non-embedding FLOPs",
         "ablation_flops": "+ output-layer FLOPs counted (budgets and N in total parameters)",
         "ablation_warmup": "+ warmup = N tokens (<= 10% of the run)",
         "corrected": "+ lr(N) from the lr sweep, beta2 0.99"}


def _grid_fit(workdir, params, budgets, bootstrap, seed):
  runs = fit.load_runs(workdir, params)
  keep = np.isin(runs["budget"], budgets)
  runs = fit.select(runs, keep)
  iso = fit._try(fit.fit_isoflop_local, runs["budget"], runs[f"N_{params}"], runs["L"],
                 runs["D"], runs[f"C_{params}"], bootstrap=bootstrap, seed=seed)
  chin = fit._try(fit.fit_chinchilla, runs["N"], runs["D"], runs["L"], grid="coarse",
                  bootstrap=bootstrap // 4, seed=seed)
  return dict(workdir=workdir, params=params, runs=len(runs["N"]), a2=iso.get("a"),
              a2_ci95=iso.get("ci", {}).get("a"), a3=chin.get("a"),
              a3_ci95=chin.get("ci", {}).get("a"), E=chin.get("E"))


def _sweep(workdir) -> dict:
  with open(os.path.join(workdir, "sweep.json")) as f:
    return json.load(f)["sweep"]


def _seeds(workdir) -> str:
  s = _sweep(workdir)
  n = int(s.get("seeds", 1))
  return "one seed" if n <= 1 else f"{n} seeds at the {s.get('seed_sizes', 'all')} sizes " \
                                   f"nearest each minimum"


def ablation_table(workdirs, *, bootstrap=200, seed=0) -> dict:
  budget_sets = [set(fit.load_runs(w)["budget"].tolist()) for w in workdirs]
  budgets = sorted(set.intersection(*budget_sets))
  rows = []
  for i, w in enumerate(workdirs):
    conv = _sweep(w).get("flops_convention", "non_embedding")
    label = STEPS["non_embedding"] if i == 0 else STEPS.get(
        os.path.basename(os.path.normpath(w)).replace("scaling_", ""), w)
    label += f" ({_seeds(w)})"
    rows.append(dict(step=label, **_grid_fit(w, conv, budgets, bootstrap, seed)))
    if i == 0 and conv == "non_embedding":
      rows.append(dict(step="  the same runs, N counted in total parameters (analysis only)",
                       **_grid_fit(w, "total", budgets, bootstrap, seed)))
  for prev, row in zip(rows, rows[1:]):
    for k in ("a2", "a3"):
      row[f"delta_{k}"] = (row[k] - prev[k]) if row[k] is not None and prev[k] is not None \
          else None
  return dict(budgets=budgets, rows=rows)


def markdown(table) -> str:
  cell = lambda v, ci: "n/a" if v is None else f"{v:.3f}" + (
      f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci else "")
  delta = lambda v: "" if v is None else f"{v:+.3f}"
  lines = [f"Budgets shared by every grid: {', '.join(f'{b:.3g}' for b in table['budgets'])}",
           "", "| grid | N counted | runs | a (approach 2) | change | a (approach 3) | change |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for r in table["rows"]:
    lines.append(f"| {r['step']} | {r['params']} | {r['runs']} | {cell(r['a2'], r['a2_ci95'])}"
                 f" | {delta(r.get('delta_a2'))} | {cell(r['a3'], r['a3_ci95'])} | "
                 f"{delta(r.get('delta_a3'))} |")
  return "\n".join(lines) + "\n"


def main(argv):
  from absl import flags
  f = flags.FLAGS
  workdirs = argv[1:]
  if len(workdirs) < 2:
    raise ValueError("give at least two sweep directories, the original grid first")
  table = ablation_table(workdirs, bootstrap=f.bootstrap)
  os.makedirs(f.out, exist_ok=True)
  with open(os.path.join(f.out, "ablation.json"), "w") as fh:
    json.dump(fit._json_safe(table), fh, indent=2)
  text = markdown(table)
  with open(os.path.join(f.out, "ablation.md"), "w") as fh:
    fh.write(text)
  print(text, end="")


if __name__ == "__main__":
  from absl import flags
  from transformer import cli
  flags.DEFINE_string("out", ".", "Directory for ablation.md and ablation.json.")
  flags.DEFINE_integer("bootstrap", 200, "Bootstrap resamples per fit.")
  cli.run(main, positional=True)
