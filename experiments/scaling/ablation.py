r"""Which of Porian et al.'s corrections moves a, and by how much: one table over the grids.

  python -m experiments.scaling.ablation --out experiments/scaling/results/grammar_corpus \
      runs/scaling_ablation runs/scaling_ablation_flops runs/scaling_ablation_warmup \
      runs/scaling_corrected

Each DIR is a finished sweep, the original grid first (configs/scaling.py designs ablation,
ablation_flops, ablation_warmup, corrected add one correction at a time, but any order
works). Each row is labelled by what its runs trained with, read from the sweep and its
runs' configs (lr or lr law, warmup, beta2, FLOPs convention, seeds), and says what changed
from the row above, so a grid run with other settings than its design's name is never
mislabelled. Every grid is fitted with approach 2 (local parabolas, seed-noise bootstrap)
and approach 3 (E free), on the budgets all grids share, in the parameter convention the
step counts (non-embedding N, as Kaplan, for grids budgeted in non-embedding FLOPs; total N
for the others); the table gives a with its interval and the change from the grid above.
The first row is also refitted with total N, which separates the counting of the output
layer from the step counts it changes. Writes ablation.md and ablation.json in --out.
"""

import json
import os

import numpy as np

from experiments.scaling import fit
from launch.sweep_dir import atomic_write


def _sweep(workdir) -> dict:
  with open(os.path.join(workdir, "sweep.json")) as f:
    return json.load(f)["sweep"]


def settings(workdir) -> dict:
  """What a finished grid's runs trained with: {lr, warmup, beta2, FLOPs, seeds}."""
  from launch import sweep  # the launcher owns the directory layout
  s = _sweep(workdir)
  run = next((r for r in sweep.read_sweep(workdir) if r["summary"]), None)
  if run is None:
    raise ValueError(f"no finished runs under {workdir}; point at a finished sweep")
  opt = lambda key: fit._config_value(run["summary"], f"opt.{key}", "?")
  seeds = int(s.get("seeds", 1))
  return {"lr": "lr(N) law" if s.get("lr_law") else f"lr {opt('lr')}",
          "warmup": "warmup N tokens" if float(s.get("warmup_tokens_per_param", 0)) > 0
                    else f"warmup {opt('warmup_steps')}",
          "beta2": f"beta2 {opt('b2')}",
          "FLOPs": f"{s.get('flops_convention', 'non_embedding').replace('_', '-')} FLOPs",
          "seeds": "one seed" if seeds <= 1 else f"{seeds} seeds at the "
                                                 f"{s.get('seed_sizes', 'all')} sizes nearest "
                                                 f"each minimum"}


def label(prev: dict | None, now: dict) -> str:
  if prev is None:
    return "original: " + ", ".join(now.values())
  changed = [v for k, v in now.items() if prev[k] != v]
  return "+ " + (", ".join(changed) if changed else "(same settings)")


def _runs(workdir, params, budgets):
  runs = fit.load_runs(workdir, params)
  return fit.select(runs, np.isin(runs["budget"], budgets))


def _approach2(runs, params, bootstrap, seed):
  iso = fit._try(fit.fit_isoflop_local, runs["budget"], runs[f"N_{params}"], runs["L"],
                 runs["D"], runs[f"C_{params}"], bootstrap=bootstrap, seed=seed)
  used = iso.get("power_law_budgets", [])
  minima = [dict(C=k.get("C_opt", k["C"]), N_opt=k["N_opt"], ci=k.get("ci", {}).get("N_opt"),
                 in_power_law=k["C"] in used) for k in iso.get("curves", []) if "N_opt" in k]
  return dict(a2=iso.get("a"), a2_ci95=iso.get("ci", {}).get("a"), a2_budgets=used,
              a2_N_coef=iso.get("N_coef"), a2_minima=minima)


def _grid_fit(workdir, params, budgets, bootstrap, seed):
  runs = _runs(workdir, params, budgets)
  chin = fit._try(fit.fit_chinchilla, runs["N"], runs["D"], runs["L"], grid="coarse",
                  bootstrap=bootstrap // 4, seed=seed)
  best = {float(c): min(float(runs["L"][(runs["budget"] == c) & (runs["N"] == n)].mean())
                        for n in np.unique(runs["N"][runs["budget"] == c]))
          for c in np.unique(runs["budget"])}
  return dict(workdir=workdir, params=params, runs=len(runs["N"]), best_loss=best,
              **_approach2(runs, params, bootstrap, seed), a3=chin.get("a"),
              a3_ci95=chin.get("ci", {}).get("a"), E=chin.get("E"))


def _deltas(rows, key):
  """Each row's change in `key` from the last grid above (the analysis-only refit: from its
  own grid, never from it)."""
  base = None
  for row in rows:
    row[f"delta_{key}"] = None if base is None or row.get(key) is None or \
        base.get(key) is None else row[key] - base[key]
    if not row.get("analysis"):
      base = row


def ablation_table(workdirs, *, bootstrap=200, seed=0) -> dict:
  budget_sets = [set(fit.load_runs(w)["budget"].tolist()) for w in workdirs]
  budgets = sorted(set.intersection(*budget_sets))
  rows, prev = [], None
  for i, w in enumerate(workdirs):
    now = settings(w)
    conv = _sweep(w).get("flops_convention", "non_embedding")
    rows.append(dict(step=label(prev, now), settings=now,
                     **_grid_fit(w, conv, budgets, bootstrap, seed)))
    if i == 0 and conv == "non_embedding":
      rows.append(dict(step="  the same runs, N counted in total parameters (analysis only)",
                       settings=now, analysis=True,
                       **_grid_fit(w, "total", budgets, bootstrap, seed)))
    prev = now
  for key in ("a2", "a3"):
    _deltas(rows, key)
  # Approach 2's power law uses only the budgets whose minimum a grid brackets, and grids
  # differ there: a change in a between rows fitted on different budgets mixes the setting
  # with the budgets. So every grid is refitted on the budgets all of them bracket.
  common = sorted(set.intersection(*(set(r["a2_budgets"]) for r in rows)))
  refit = len(common) >= 2 and any(r["a2_budgets"] != common for r in rows)
  for row in rows if refit else []:
    a2 = _approach2(_runs(row["workdir"], row["params"], common), row["params"], bootstrap, seed)
    row.update(a2_common=a2["a2"], a2_common_ci95=a2["a2_ci95"])
  if refit:
    _deltas(rows, "a2_common")
  return dict(budgets=budgets, rows=rows, common_a2_budgets=common if refit else None)


def markdown(table) -> str:
  cell = lambda v, ci: "n/a" if v is None else f"{v:.3f}" + (
      f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci else "")
  delta = lambda v: "" if v is None else f"{v:+.3f}"
  names = lambda cs: ", ".join(f"{c:.3g}" for c in cs) or "none"
  lines = [f"Budgets shared by every grid: {names(table['budgets'])}",
           "", "| grid | N counted | runs | a (approach 2) | change | approach 2's budgets | "
           "a (approach 3) | change |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in table["rows"]:
    lines.append(f"| {r['step']} | {r['params']} | {r['runs']} | {cell(r['a2'], r['a2_ci95'])}"
                 f" | {delta(r.get('delta_a2'))} | {names(r['a2_budgets'])} | "
                 f"{cell(r['a3'], r['a3_ci95'])} | {delta(r.get('delta_a3'))} |")
  if table.get("common_a2_budgets"):
    lines += ["", "Approach 2 uses the budgets whose minimum a grid brackets, and these differ "
              "between the grids; refitted on the budgets every grid brackets ("
              f"{names(table['common_a2_budgets'])}):", "",
              "| grid | a (approach 2, shared budgets) | change |", "| --- | --- | --- |"]
    lines += [f"| {r['step']} | {cell(r['a2_common'], r['a2_common_ci95'])} | "
              f"{delta(r.get('delta_a2_common'))} |" for r in table["rows"]]
  grids = [r for r in table["rows"] if not r.get("analysis")]
  lines += ["", "Lowest loss per budget (the seed mean at the best size; nats/token). Each grid "
            "counts its budgets in its own FLOPs convention: at one nominal budget, a grid "
            "budgeted in non-embedding FLOPs trains each model on more tokens than one budgeted "
            "in total FLOPs (by the ratio of the two counts).", "",
            "| grid | " + " | ".join(f"{c:.3g}" for c in table["budgets"]) + " |",
            "| --- |" + " ---: |" * len(table["budgets"])]
  lines += [f"| {r['step']} | " + " | ".join(
      f"{r['best_loss'][c]:.4f}" if c in r["best_loss"] else "n/a" for c in table["budgets"])
            + " |" for r in grids]
  return "\n".join(lines) + "\n"


def main(argv):
  from absl import flags
  f = flags.FLAGS
  workdirs = argv[1:]
  if len(workdirs) < 2:
    raise ValueError("give at least two sweep directories, the original grid first")
  table = ablation_table(workdirs, bootstrap=f.bootstrap)
  os.makedirs(f.out, exist_ok=True)
  atomic_write(os.path.join(f.out, "ablation.json"), json.dumps(fit._json_safe(table), indent=2))
  atomic_write(os.path.join(f.out, "ablation.md"), markdown(table))
  from experiments.scaling import plots  # matplotlib only where a figure is written
  plots.plot_ablation(os.path.join(f.out, "ablation.png"), table)
  print(text, end="")


if __name__ == "__main__":
  from absl import flags
  from transformer import cli
  flags.DEFINE_string("out", ".", "Directory for ablation.md and ablation.json.")
  flags.DEFINE_integer("bootstrap", 1000, "Bootstrap resamples per fit (as fit.py's default).")
  cli.run(main, positional=True)
