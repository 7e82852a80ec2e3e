"""Scaling-law fits of a finished sweep: Chinchilla approaches 2 and 3, Kaplan L(N) and L(C).

  python -m experiments.scaling.fit --workdir DIR

reads DIR/sweep.json and every DIR/<run>/summary.json and writes DIR/fit.json, DIR/results.md
and the PNGs of experiments/scaling/plots.py. The fits live by approach in approach2.py
(IsoFLOP curves), approach3.py (the parametric L(N, D)) and power_laws.py (Kaplan's L(N) and
L(C), intervals); they take plain arrays, so a notebook can fit any (N, D, L) table without a
sweep directory. This file reads the sweep directory and writes the results.

Conventions (README.md): N is all parameters, the tied embedding = output projection included
(Chinchilla / Porian et al. 2024), unless `--params=non_embedding` (Kaplan et al.); every
headline exponent is also reported in the other convention (fit.json `conventions.other`).
D is tokens trained on; C is training FLOPs, 6 N + 6 L T H hd per token with the same N. The
compute-optimal allocation of approach 3 uses C = 6ND, as Hoffmann et al. do; approach 2 reads
each run's FLOPs (attention included) off its IsoFLOP curve. E* (the known loss floor) comes
from the runs' summary.json `loss_floor` or --E_star.
"""

import json
import math
import os
import shlex
import sys

# scipy's bundled OpenBLAS threads even the 10x10 algebra inside L-BFGS-B, and on a busy
# 2-core machine its spinning threads made the fits 15-20x slower. This only takes effect when
# this module is the first to load numpy/scipy (the CLI); a caller that already did keeps its
# setting.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

# The fits themselves, by approach; their names stay reachable as fit.<name>.
from experiments.scaling.approach2 import (_power_laws, fit_isoflop,  # noqa: E402,F401
                                           fit_isoflop_local, seed_noise)
from experiments.scaling.approach3 import (INIT_GRIDS, LAW_KEYS, _with_exponents,  # noqa: E402,F401
                                           a_against_fixed_E, compute_optimal, fit_chinchilla,
                                           init_grid, predict_loss)
from experiments.scaling.power_laws import (fit_frontier, fit_kaplan,  # noqa: E402,F401
                                            lower_envelope, power_law)


# --- a sweep directory -> fit.json, results.md, PNGs ------------------------------------------

def load_runs(workdir: str, params: str = "non_embedding") -> dict:
  """Finished runs of a sweep as arrays: name, N, D, L, C (training FLOPs), budget, curves.

  `budget` is the IsoFLOP budget sweep.json declared for the run; runs from sweeps without
  one are grouped by their FLOPs to two significant digits. `curves` holds per run the
  (FLOPs, loss) points of metrics.jsonl: eval_loss where logged, else the training loss.
  """
  from launch import sweep  # the launcher owns the directory layout
  from transformer.training import metrics_file

  if params not in ("non_embedding", "total"):
    raise ValueError(f"unknown --params {params!r}; valid: ['non_embedding', 'total']")
  rows = [r for r in sweep.read_sweep(workdir) if r["summary"]]
  rows = [r for r in rows if np.isfinite(r["summary"].get("final_eval_loss", np.nan))]
  if not rows:
    raise ValueError(f"no finished runs (DIR/<run>/summary.json) under {workdir}; point "
                     f"--workdir at a sweep directory whose runs have finished")
  s = [r["summary"] for r in rows]
  out = dict(name=[r["name"] for r in rows],
             N=np.array([x[f"params_{params}"] for x in s], np.float64),
             D=np.array([x["tokens"] for x in s], np.float64),
             L=np.array([x["final_eval_loss"] for x in s], np.float64),
             C=np.array([x["flops"] for x in s], np.float64))
  # Both conventions, whatever `params` is (summaries from before flops_total existed get it
  # from the identity C_total - C_non_embedding = 6 (N_total - N_non_embedding) D).
  out["N_total"] = np.array([x["params_total"] for x in s], np.float64)
  out["N_non_embedding"] = np.array([x["params_non_embedding"] for x in s], np.float64)
  out["C_non_embedding"] = out["C"]
  out["C_total"] = np.array([x.get("flops_total") or x["flops"] + 6 * (
      x["params_total"] - x["params_non_embedding"]) * x["tokens"] for x in s], np.float64)
  if params == "total":
    out["C"] = out["C_total"]
  out["seed"] = np.array([int(_config_value(x, "train.seed", 0)) for x in s])
  out["loss_floor"] = [x.get("loss_floor") for x in s]
  out["doc_sentences"] = [_config_value(x, "data.doc_sentences", None) for x in s]
  out["layers"] = np.array([_num_layers(workdir, r) for r in rows])
  out["budget"] = np.array([r["declared"].get("budget") or float(f"{c:.2g}")
                            for r, c in zip(rows, out["C"])], np.float64)
  out["curves"], metrics = [], set()
  for r, x, run_flops in zip(rows, s, out["C"]):
    points = []
    path = os.path.join(workdir, r["name"], "metrics.jsonl")
    if os.path.exists(path):  # a torn last line is dropped with a warning naming the file
      points = metrics_file.read(path)
    # In the fits' convention, as C is: the frontier L(C) is fitted on these points.
    flops_per_step = run_flops / max(x["step"], 1)
    evals = [(p["step"] * flops_per_step, p["eval_loss"]) for p in points
             if isinstance(p.get("eval_loss"), (int, float)) and p["step"] > 0]
    metrics.add("eval_loss" if evals else "loss" if points else "final_eval_loss")
    if not evals:
      evals = [(p["step"] * flops_per_step, p["loss"]) for p in points
               if isinstance(p.get("loss"), (int, float)) and p["step"] > 0]
    evals.append((run_flops, x["final_eval_loss"]))
    out["curves"].append(np.array(sorted(evals)))
  # What the curves hold: eval losses, training losses where a run logged no eval, or only
  # each run's final eval loss (runs rebuilt from a published table have no metrics.jsonl).
  out["curve_metric"] = ("loss" if "loss" in metrics else "eval_loss" if "eval_loss" in metrics
                         else "final_eval_loss")
  return out


def _config_value(summary: dict, key: str, default):
  config = summary.get("config", {})
  if key in config:
    return config[key]
  node = config
  for part in key.split("."):
    if not isinstance(node, dict) or part not in node:
      return default
    node = node[part]
  return node


def loss_floor(runs: dict, override: float | None = None) -> dict:
  """E*: the runs' summary.json `loss_floor` (all must agree), or `override` (--E_star)."""
  known = [float(v) for v in runs["loss_floor"] if isinstance(v, (int, float))]
  source = "summary.json loss_floor"
  if known and len(known) != len(runs["loss_floor"]):
    raise ValueError(f"{len(runs['loss_floor']) - len(known)} of {len(known) + len(runs['loss_floor']) - len(known)} runs have no loss_floor in "
                     f"summary.json while the others do: the runs come from different data "
                     f"versions; re-run them or pass --E_star")
  if known and max(known) - min(known) > 1e-6 * max(abs(max(known)), 1e-12):
    raise ValueError(f"the runs disagree on loss_floor ({min(known):.6g} .. {max(known):.6g}):"
                     f" they were trained on different data; fit them separately")
  value = known[0] if known else None
  if override is not None:
    if value is not None and abs(value - override) > 1e-6 * abs(value):
      source = f"--E_star (the runs' loss_floor is {value:.6g})"
    else:
      source = "--E_star"
    value = float(override)
  docs = sorted({str(d) for d in runs["doc_sentences"] if d is not None})
  if len(docs) > 1:
    raise ValueError(f"the runs disagree on data.doc_sentences ({', '.join(docs)}); fit each "
                     f"data setting separately")
  return dict(E_star=value, source=source if value is not None else None,
              doc_sentences=docs[0] if docs else None)


def _num_layers(workdir: str, row: dict) -> int:
  path = os.path.join(workdir, row["name"], "config.json")
  if os.path.exists(path):
    with open(path) as f:
      return int(json.load(f)["model"]["num_layers"])
  return int(row["declared"].get("overrides", {}).get("model.num_layers", 0))


def select(runs: dict, keep) -> dict:
  """The runs where `keep` is True (arrays and per-run lists alike)."""
  return {k: (v[keep] if isinstance(v, np.ndarray) else
              [x for x, ok in zip(v, keep) if ok] if isinstance(v, list) else v)
          for k, v in runs.items()}


def _json_safe(value):
  """NaN/inf -> None: fit.json stays strict JSON for other tools."""
  if isinstance(value, dict):
    return {k: _json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_safe(v) for v in value]
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  if isinstance(value, np.integer):
    return int(value)
  return value


def _try(fn, *args, **kwargs) -> dict:
  """A sweep too small for one fit still gets the others; the reason lands in fit.json."""
  try:
    return fn(*args, **kwargs)
  except (ValueError, np.linalg.LinAlgError) as e:
    return dict(error=str(e))


def _approach2(runs, params, bootstrap, seed, points):
  return _try(fit_isoflop_local, runs["budget"], runs[f"N_{params}"], runs["L"], runs["D"],
              runs[f"C_{params}"], points=points, bootstrap=bootstrap, seed=seed)


def fit_sweep(workdir: str, *, params: str = "total", grid: str = "hoffmann",
              bootstrap: int = 200, seed: int = 0, plots: bool = True,
              min_layers: int = 1, E_star: float | None = None,
              bootstrap_grid: str = "coarse", local_points: int = 5,
              fixed_E_grid: str = "coarse") -> dict:
  """All fits of a sweep directory; writes fit.json, results.md and (with plots) the PNGs.

  N counts `params` parameters (default total, the Chinchilla / Porian et al. convention;
  every headline number is also given in the other convention under `conventions`). E* is
  the runs' summary.json `loss_floor` (or `E_star`); approach 3 is fitted with E free and
  with E fixed there. Runs with fewer than min_layers layers are left out of every fit (and
  drawn hollow).
  """
  from launch import sweep

  all_runs = load_runs(workdir, params)
  keep = (all_runs["layers"] >= min_layers) | (all_runs["layers"] == 0)  # 0: depth unknown
  if not keep.any():
    raise ValueError(f"every run of {workdir} has fewer than --min_layers={min_layers} layers")
  runs = select(all_runs, keep)
  floor = loss_floor(runs, E_star)
  budgets = np.unique(runs["budget"])
  chin = _try(fit_chinchilla, runs["N"], runs["D"], runs["L"], grid=grid,
              bootstrap=bootstrap, seed=seed, budgets=budgets, bootstrap_grid=bootstrap_grid)
  chin_fixed = {}
  if floor["E_star"] is not None:
    chin_fixed = _try(fit_chinchilla, runs["N"], runs["D"], runs["L"], grid=grid,
                      bootstrap=bootstrap, seed=seed, budgets=budgets, E=floor["E_star"],
                      bootstrap_grid=bootstrap_grid)
  iso = _approach2(runs, params, bootstrap, seed, local_points)
  other = "non_embedding" if params == "total" else "total"
  iso_other = _approach2(runs, other, bootstrap, seed, local_points)
  chin_other = _try(fit_chinchilla, runs[f"N_{other}"], runs["D"], runs["L"], grid="coarse")
  if floor["E_star"] is not None:
    e_values = [floor["E_star"] * f for f in (0.5, 0.75, 0.9, 1.0, 1.1)]
  else:
    e_values = [runs["L"].min() * f for f in (0.1, 0.3, 0.5, 0.7, 0.9)]
  e_values = [e for e in e_values if e < runs["L"].min()]
  a_vs_e = a_against_fixed_E(runs["N"], runs["D"], runs["L"], e_values, grid=fixed_E_grid)
  kaplan = _try(fit_kaplan, runs["N"], runs["L"], bootstrap=bootstrap, seed=seed)
  curve_c = np.concatenate([c[:, 0] for c in runs["curves"]])
  curve_l = np.concatenate([c[:, 1] for c in runs["curves"]])
  curve_run = np.concatenate([np.full(len(c), i) for i, c in enumerate(runs["curves"])])
  frontier = _try(fit_frontier, curve_c, curve_l, run=curve_run, bootstrap=bootstrap, seed=seed)
  frontier["metric"] = runs["curve_metric"]
  from experiments.scaling import shapes
  result = {k: chin[k] for k in LAW_KEYS + ("a", "b") if k in chin}
  ci = chin.get("ci", {})
  result.update(
      E_star=floor["E_star"], E_star_source=floor["source"],
      E_vs_E_star=(chin["E"] / floor["E_star"] - 1) if floor["E_star"] and "E" in chin
      else None,
      a_ci95=ci.get("a"), b_ci95=ci.get("b"),
      a_approach2=iso.get("a"), a_approach2_ci95=iso.get("ci", {}).get("a"),
      b_approach2=iso.get("b"), b_approach2_ci95=iso.get("ci", {}).get("b"),
      a_fixed_E_star=chin_fixed.get("a"),
      a_fixed_E_star_ci95=chin_fixed.get("ci", {}).get("a"),
      tokens_per_param=[dict(C=k["C"], approach2=k.get("tokens_per_param"),
                             approach2_inside=k.get("inside"), bracketed=k.get("bracketed"),
                             approach3=next((o["tokens_per_param"] for o in chin.get(
                                 "optimal", []) if o["C"] == k["C"]), None))
                        for k in iso.get("curves", [])],
      conventions=dict(
          params=params,
          params_meaning="all parameters, the tied embedding = output projection included"
          if params == "total" else "non-embedding parameters (Kaplan et al. 2020)",
          flops=shapes.FLOPS_CONVENTIONS[params] + " x tokens",
          approach3_compute="C = 6 N D (the closed form of Hoffmann et al.; the attention "
                            "term is outside it)",
          approach2_compute=f"each run's FLOPs in the {params} convention, read off each "
                            f"IsoFLOP curve at its vertex",
          budgets=_budget_convention(workdir),
          other=dict(params=other, a_approach2=iso_other.get("a"),
                     a_approach2_ci95=iso_other.get("ci", {}).get("a"),
                     b_approach2=iso_other.get("b"), a_approach3=chin_other.get("a"),
                     b_approach3=chin_other.get("b"))),
      dataset=dict(loss_floor=floor["E_star"], doc_sentences=floor["doc_sentences"]))
  excluded = [n for n, k in zip(all_runs["name"], keep) if not k]
  result.update(params=params, num_runs=len(runs["N"]), min_layers=min_layers,
                excluded_runs=excluded, chinchilla=chin, chinchilla_fixed_E=chin_fixed,
                a_against_fixed_E=a_vs_e, isoflop=iso, isoflop_other_convention=iso_other,
                chinchilla_other_convention=chin_other, kaplan=kaplan, frontier=frontier)
  sweep.atomic_write(os.path.join(workdir, "fit.json"), json.dumps(_json_safe(result), indent=2))
  with open(sweep.write_results(workdir, keep_below=False), "a") as f:
    f.write(fit_markdown(result, workdir))
  if plots:
    from experiments.scaling import plots as plotting
    result["plots"] = plotting.plot_all(workdir, runs, result,
                                        excluded=select(all_runs, ~keep))
  return result


def _budget_convention(workdir: str) -> str:
  path = os.path.join(workdir, "sweep.json")
  if not os.path.exists(path):
    return "unknown (no sweep.json): runs grouped by their FLOPs"
  with open(path) as f:
    record = json.load(f)
  conv = record.get("budgets_convention") or record.get("sweep", {}).get(
      "flops_convention") or "non_embedding"
  from experiments.scaling import shapes
  return f"{conv}: {shapes.FLOPS_CONVENTIONS.get(conv, conv)}"


def fit_markdown(result: dict, workdir: str) -> str:
  """The fits under the runs table of results.md, with how and where the sweep ran."""
  from experiments import results as experiment_results
  from launch import sweep

  lines = ["", f"## Fits ({result['num_runs']} runs, {result['params']} parameters"
           + (f"; left out: {', '.join(result['excluded_runs'])} (fewer than "
              f"{result['min_layers']} layers)" if result["excluded_runs"] else "") + ")", ""]
  chin, iso, kap = result["chinchilla"], result["isoflop"], result["kaplan"]
  conv = result.get("conventions", {})
  if conv:
    lines += [f"Conventions: N = {conv['params_meaning']}; C = {conv['flops']}; IsoFLOP "
              f"budgets in {conv['budgets']}.", ""]
  if "alpha" in chin:
    ci = chin.get("ci", {})
    cell = lambda k: f"{chin[k]:.4g}" + (f" [{ci[k][0]:.3g}, {ci[k][1]:.3g}]" if k in ci else "")
    lines += ["Approach 3, L(N, D) = E + A/N^alpha + B/D^beta (Huber on log loss, L-BFGS from "
              "a grid; bootstrap 95% intervals):", "",
              "| E | A | B | alpha | beta | a = beta/(alpha+beta) | b |",
              "| --- | --- | --- | --- | --- | --- | --- |",
              "| " + " | ".join(cell(k) for k in ("E", "A", "B", "alpha", "beta", "a", "b")) + " |",
              "", "| budget C | N_opt | D_opt | tokens per parameter |", "| --- | --- | --- | --- |"]
    lines += [f"| {o['C']:.3g} | {o['N_opt']:.3g} | {o['D_opt']:.3g} | "
              f"{o['tokens_per_param']:.0f} |" for o in chin.get("optimal", [])]
  else:
    lines.append(f"Approach 3: {chin.get('error', 'no fit')}")
  lines.append("")
  fmt_ci = lambda v, spec=".3f": (f" [{v[0]:{spec}}, {v[1]:{spec}}]" if v and None not in v
                                   else "")
  if result.get("E_star") is not None:
    fixed = result.get("chinchilla_fixed_E", {})
    lines.append(f"Loss floor E* = {result['E_star']:.4f} nats/token ({result['E_star_source']});"
                 f" E free = {result.get('E', float('nan')):.4f} "
                 f"({100 * (result.get('E_vs_E_star') or 0):+.1f}% of E*). Approach 3 with E "
                 f"fixed at E*: a = {fixed.get('a', float('nan')):.3f}"
                 f"{fmt_ci(result.get('a_fixed_E_star_ci95'))}.")
    lines.append("")
  if result.get("a_against_fixed_E"):
    lines += ["| E fixed at | a | b | alpha | beta | rms log residual |",
              "| --- | --- | --- | --- | --- | --- |"]
    for row in result["a_against_fixed_E"]:
      if "a" in row:
        lines.append(f"| {row['E']:.4g} | {row['a']:.3f} | {row['b']:.3f} | "
                     f"{row['alpha']:.3f} | {row['beta']:.3f} | {row['rms_log_residual']:.4f} |")
    lines.append("")
  if "a" in iso:
    lines.append(f"Approach 2 (local parabolas over the {iso.get('points', '?')} sizes nearest "
                 f"each measured minimum, seed-noise bootstrap): N_opt ~ C^{iso['a']:.3f}"
                 f"{fmt_ci(iso.get('ci', {}).get('a'))}, D_opt ~ C^{iso.get('b', float('nan')):.3f}"
                 f"{fmt_ci(iso.get('ci', {}).get('b'))} over the budgets "
                 f"{', '.join(f'{c:.3g}' for c in iso['power_law_budgets'])} whose minimum "
                 f"lies inside the fitted sizes.")
  else:
    lines.append(f"Approach 2: {iso.get('error', 'fewer than two budgets bracket their minimum')}")
  curves = [k for k in iso.get("curves", []) if "N_opt" in k]
  if curves:
    lines += ["", "| budget | N_opt (approach 2) | tokens/param (2) | tokens/param (3) | sizes "
              "left / right of the measured minimum |", "| --- | --- | --- | --- | --- |"]
    by_c = {t["C"]: t for t in result.get("tokens_per_param", [])}
    for k in curves:
      t3 = by_c.get(k["C"], {}).get("approach3")
      lines.append(f"| {k['C']:.3g} | {k['N_opt']:.3g}{fmt_ci(k.get('ci', {}).get('N_opt'), '.3g')} | "
                   f"{k.get('tokens_per_param', float('nan')):.1f} | "
                   f"{t3 if t3 is None else f'{t3:.1f}'} | {k['sizes_left']} / "
                   f"{k['sizes_right']}{'' if k.get('bracketed') else ' (add sizes)'} |")
  if iso.get("skipped"):  # budgets with no IsoFLOP minimum: say why they are not in the table
    lines += ["", "Left out of approach 2: " + "; ".join(
        f"{k['C']:.3g} ({k['reason']})" for k in iso["skipped"]) + "."]
  other = conv.get("other", {})
  if other:
    a2, a3 = other.get("a_approach2"), other.get("a_approach3")
    lines += ["", f"The same fits with N = {other['params']} parameters: approach 2 a = "
              f"{'n/a' if a2 is None else f'{a2:.3f}'}{fmt_ci(other.get('a_approach2_ci95'))}, "
              f"approach 3 a = {'n/a' if a3 is None or not np.isfinite(a3) else f'{a3:.3f}'}."]
  if "alpha_N" in kap:
    lines.append(f"Kaplan L(N) = (N_c/N)^alpha_N on the best loss per size ({result['params']}"
                 f" N): alpha_N = {kap['alpha_N']:.3f}{fmt_ci(kap.get('ci', {}).get('alpha_N'))}.")
  front = result["frontier"]
  if "alpha_C" in front:
    points = {"eval_loss": "every run's eval-loss curve", "loss": "every run's training-loss "
              "curve", "final_eval_loss": "each run's final eval loss (no curves recorded)"}
    lines.append(f"Compute frontier L(C) = (C_c/C)^alpha_C on the lower envelope of "
                 f"{points[front['metric']]}, C in the {result['params']} convention: "
                 f"alpha_C = {front['alpha_C']:.3f}{fmt_ci(front.get('ci', {}).get('alpha_C'))}.")
  if kap.get("ci") or front.get("ci"):
    lines.append("(alpha_N and alpha_C intervals: 95% percentile bootstrap over resamples of "
                 "the runs.)")
  wall = sum(r["summary"].get("wall_time_s", 0) for r in sweep.read_sweep(workdir) if r["summary"])
  command = shlex.join(["python", "-m", "experiments.scaling.fit"] + sys.argv[1:])
  lines += ["", f"Fit command: `{command}`  ",
            f"Machine: {experiment_results.cpu_model()}, {os.cpu_count()} cores. Training wall "
            f"time summed over the runs: {wall / 60:.0f} min.", ""]
  return "\n".join(lines)


def main(argv):
  del argv
  from absl import flags
  f = flags.FLAGS
  # A sweep directory without finished runs, or too few to fit: ValueError, one line.
  result = fit_sweep(f.workdir, params=f.params, grid=f.grid, bootstrap=f.bootstrap,
                     seed=f.seed, min_layers=f.min_layers, E_star=f.E_star,
                     bootstrap_grid=f.bootstrap_grid, local_points=f.local_points)
  for name in ("chinchilla", "isoflop", "kaplan", "frontier"):
    part = result[name]
    if "error" in part:
      print(f"{name}: skipped ({part['error']})")
  if "alpha" in result:
    print("L(N, D) = {E:.3f} + {A:.4g}/N^{alpha:.3f} + {B:.4g}/D^{beta:.3f};  "
          "N_opt ~ C^{a:.3f}, D_opt ~ C^{b:.3f}".format(**result))
  if result.get("E_star") is not None:
    a = result.get("a_fixed_E_star")
    print(f"E* = {result['E_star']:.4f}; approach 3 with E = E*: a = "
          + (f"{a:.3f}" if isinstance(a, (int, float)) else str(a)))
  if "a" in result["isoflop"] and "b" in result["isoflop"]:
    print("IsoFLOP: N_opt ~ C^{a:.3f}, D_opt ~ C^{b:.3f}".format(**result["isoflop"])
          + " over budgets " + ", ".join(f"{c:.3g}" for c in result["isoflop"]["power_law_budgets"])
          + " (minimum inside the sizes)")
  if result["excluded_runs"]:
    print(f"left out of the fits (< {f.min_layers} layers): {', '.join(result['excluded_runs'])}")
  print(f"wrote {os.path.join(f.workdir, 'fit.json')}, results.md and plots")


if __name__ == "__main__":
  from absl import flags
  from transformer import cli

  flags.DEFINE_string("workdir", None, "Sweep directory: DIR/<run>/summary.json per run.")
  flags.DEFINE_enum("params", "total", ["non_embedding", "total"],
                    "Which parameter count is N in the fits (and FLOPs in approach 2); the "
                    "other convention is reported under `conventions.other`.")
  flags.DEFINE_float("E_star", None, "Known loss floor (nats/token); default: the runs' "
                     "summary.json loss_floor, which must agree.")
  flags.DEFINE_enum("bootstrap_grid", "coarse", sorted(INIT_GRIDS) + ["optimum"],
                    "Starts of each approach-3 bootstrap refit (optimum: the full fit only).")
  flags.DEFINE_integer("local_points", 5, "Sizes per approach-2 parabola, nearest each "
                       "budget's measured minimum.")
  flags.DEFINE_enum("grid", "hoffmann", sorted(INIT_GRIDS), "Approach-3 initialisation grid.")
  # 1000, not 200: a 95% percentile interval's ends are set by the 25 resamples in each tail;
  # with 200 (5 per tail) they are poorly estimated: the extended grid's interval of a came
  # out much narrower than with 1000 (results/grammar_corpus/extended_results.md).
  flags.DEFINE_integer("bootstrap", 1000, "Bootstrap resamples for confidence intervals.")
  flags.DEFINE_integer("seed", 0, "Bootstrap seed.")
  flags.DEFINE_integer("min_layers", 1, "Leave runs with fewer layers out of the fits "
                       "(2 drops one-layer models, which sit off the trend).")
  cli.run(main, required=("workdir",))
