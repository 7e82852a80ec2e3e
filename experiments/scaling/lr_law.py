r"""Fit lr(N) = coef * N^exponent from a finished learning-rate sweep (configs/scaling.py
design=lr_sweep) and write it where the main grid reads it.

  python -m experiments.scaling.lr_law --workdir runs/scaling_lr
      # -> runs/scaling_lr/lr_law.json (read by design=corrected via sweep.lr_law),
      #    runs/scaling_lr/lr_sweep.png

Per size (N in the sweep's size convention, total by default) the best learning rate is the
vertex of a parabola of the seed-mean final eval loss in log10 lr over the best rate and its
two neighbours (the best rate itself when it sits at the edge of the rates tried: then
`edge` is true and the law is flagged). The power law is least squares in log-log.

Two ranges for the exponent:
- `exponent_ci95` (with `--noise_sd`): a parametric bootstrap. Every loss gets Gaussian noise
  of the seed-to-seed sd (over sqrt(seeds) for a seed mean), the sd itself redrawn from its
  chi-square distribution with `--noise_dof` degrees of freedom, and the vertices and the law
  are fitted again. A sweep with one seed per point cannot measure its own noise: give the sd
  measured on the same corpus (the main grid's seeds: fit.json's isoflop.seed_noise, which
  `--noise_from FIT_JSON` reads).
- `exponent_tol_range`: the exponents of optima drawn anywhere within `tol` nats of each
  parabola's minimum (uniform in log lr). It shows how flat the optima are, not how noisy the
  losses were: it is not a confidence interval (its coverage depends on the noise, which it
  never sees).
"""

import json
import math
import os

import numpy as np


def best_lr(lrs, losses) -> dict:
  """Vertex of the parabola through the best rate and its neighbours (in log10 lr)."""
  order = np.argsort(lrs)
  x, y = np.log10(np.asarray(lrs, float)[order]), np.asarray(losses, float)[order]
  i = int(np.argmin(y))
  if i == 0 or i == len(x) - 1 or len(x) < 3:
    return dict(lr=float(10 ** x[i]), loss=float(y[i]), edge=True, coef=None)
  coef = np.polyfit(x[i - 1:i + 2], y[i - 1:i + 2], 2)
  vertex = -coef[1] / (2 * coef[0]) if coef[0] > 0 else x[i]
  return dict(lr=float(10 ** vertex), loss=float(np.polyval(coef, vertex)), edge=False,
              coef=coef.tolist())


def _flat_range(best, tol):
  """log10 lr range where the local parabola is within tol of its minimum."""
  x0 = math.log10(best["lr"])
  if not best["coef"] or best["coef"][0] <= 0:
    return x0 - 0.15, x0 + 0.15  # half a factor-2 step each way
  half = math.sqrt(tol / best["coef"][0])
  return x0 - half, x0 + half


def fit_lr_law(sizes, per_size, *, tol: float = 0.005, noise_sd: float = 0.0,
               noise_dof: int = 0, bootstrap: int = 1000, seed: int = 0):
  """The law, its tolerance range and, given the loss noise, its 95% interval (module
  docstring). per_size rows hold lrs, losses (seed means), seeds (per rate; default 1)."""
  n = np.log10(np.asarray(sizes, float))
  y = np.log10([b["lr"] for b in per_size])
  exponent, intercept = np.polyfit(n, y, 1)
  rng = np.random.default_rng(seed)
  ranges = [_flat_range(b, tol) for b in per_size]
  draws = []
  for _ in range(bootstrap):
    yy = [rng.uniform(lo, hi) for lo, hi in ranges]
    draws.append(np.polyfit(n, yy, 1)[0])
  out = dict(coef=float(10 ** intercept), exponent=float(exponent),
             exponent_tol_range=np.percentile(draws, [2.5, 97.5]).tolist(), tol=tol,
             edge=any(b["edge"] for b in per_size))
  if noise_sd > 0:
    if noise_dof < 1:
      raise ValueError("--noise_sd needs --noise_dof, the degrees of freedom it was measured "
                       "with (fit.json's isoflop.seed_noise.dof)")
    draws = []
    for _ in range(bootstrap):
      # sigma given the measured sd: sd * sqrt(dof / chi2_dof), as approach 2 draws it (the
      # inverse of the sd's own sampling distribution), which gives the intervals t tails.
      sd = noise_sd * math.sqrt(noise_dof / rng.chisquare(noise_dof))
      vertices = []
      for b in per_size:
        seeds = np.asarray(b.get("seeds") or [1] * len(b["lrs"]), float)
        losses = np.asarray(b["losses"]) + rng.normal(0.0, sd / np.sqrt(seeds))
        vertices.append(math.log10(best_lr(b["lrs"], losses)["lr"]))
      draws.append(np.polyfit(n, vertices, 1)[0])
    out.update(exponent_ci95=np.percentile(draws, [2.5, 97.5]).tolist(), noise_sd=noise_sd,
               noise_dof=noise_dof)
  return out


def from_sweep(workdir: str, tol: float = 0.005, noise_sd: float = 0.0,
               noise_dof: int = 0) -> dict:
  from launch import sweep
  path = os.path.join(workdir, "sweep.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} not found; --workdir takes the directory of the "
                            f"design=lr_sweep sweep (launch.local --config "
                            f"configs/scaling.py:design=lr_sweep --workdir DIR)")
  with open(path) as f:
    record = json.load(f)
  convention = record["sweep"].get("size_convention", "non_embedding")
  rows = [r for r in sweep.read_sweep(workdir) if r["summary"]]
  table = {}
  for r in rows:
    s = r["summary"]
    lr = float(s["config"].get("opt.lr", r["declared"].get("overrides", {}).get("opt.lr")))
    table.setdefault(s[f"params_{convention}"], {}).setdefault(lr, []).append(
        s["final_eval_loss"])
  if len(table) < 2:
    raise ValueError(f"{workdir}: need finished runs at >= 2 sizes to fit lr(N), got "
                     f"{len(table)}")
  sizes = sorted(table)
  per_size = []
  for n in sizes:
    lrs = sorted(table[n])
    best = best_lr(lrs, [np.mean(table[n][lr]) for lr in lrs])
    per_size.append(dict(N=n, lrs=lrs, losses=[float(np.mean(table[n][lr])) for lr in lrs],
                         seeds=[len(table[n][lr]) for lr in lrs], **best))
  law = fit_lr_law(sizes, per_size, tol=tol, noise_sd=noise_sd, noise_dof=noise_dof)
  law.update(convention=convention, per_size=per_size, sweep=os.path.abspath(workdir),
             formula=f"opt.lr = coef * N_{convention}^exponent",
             batch_sizes=record["sweep"].get("batch_sizes"),
             note="read by configs/scaling.py design=corrected (sweep.lr_law); fitted at ~"
                  f"{record['sweep'].get('tokens_per_param')} tokens per parameter")
  return law


def noise_from(path: str) -> tuple[float, int]:
  """(sd, dof) of the seed noise a grid's fit measured: FIT_JSON's isoflop.seed_noise."""
  try:
    with open(path) as f:
      noise = json.load(f)["isoflop"]["seed_noise"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"--noise_from={path}: not a scaling fit's fit.json with "
                     f"isoflop.seed_noise ({type(e).__name__}: {e}); give the fit.json that "
                     f"python -m experiments.scaling.fit wrote") from None
  if not noise.get("sigma") or not noise.get("dof"):
    raise ValueError(f"--noise_from={path}: its grid has no repeated seeds, so it measured no "
                     f"seed noise ({noise.get('sigma_from', 'sigma is empty')}); give a grid "
                     f"fit with seeds")
  return float(noise["sigma"]), int(noise["dof"])


def plot(path, law):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.5, 4.3))
  for i, row in enumerate(law["per_size"]):
    color = plt.get_cmap("viridis")(i / max(len(law["per_size"]) - 1, 1) * 0.9)
    ax.plot(row["lrs"], row["losses"], "o-", color=color, label=f"N = {row['N']:.3g}")
    ax.plot([row["lr"]], [row["loss"]], "*", color=color, ms=13, mec="black", mew=0.6)
  lo, hi = law.get("exponent_ci95") or law["exponent_tol_range"]
  what = "95%" if "exponent_ci95" in law else f"within {law['tol']} nats"
  ax.set(xscale="log", xlabel="peak learning rate", ylabel="final eval loss (nats/token)",
         title=f"lr sweep: lr* = {law['coef']:.3g} N^{law['exponent']:.3f} "
               f"[{lo:.2f}, {hi:.2f}] ({what})")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=130, bbox_inches="tight")
  plt.close(fig)
  return path


def main(argv):
  del argv
  from absl import flags
  f = flags.FLAGS
  noise_sd, noise_dof = f.noise_sd, f.noise_dof
  if f.noise_from:
    if noise_sd or noise_dof:
      raise ValueError("give --noise_from or --noise_sd/--noise_dof, not both")
    noise_sd, noise_dof = noise_from(f.noise_from)
  law = from_sweep(f.workdir, f.tol, noise_sd, noise_dof)
  out = f.out or os.path.join(f.workdir, "lr_law.json")
  from launch.sweep_dir import atomic_write
  atomic_write(out, json.dumps(law, indent=2))
  plot(os.path.join(f.workdir, "lr_sweep.png"), law)
  lo, hi = law["exponent_tol_range"]
  ci = (f"95% [{law['exponent_ci95'][0]:.3f}, {law['exponent_ci95'][1]:.3f}]; "
        if "exponent_ci95" in law else "no interval without --noise_sd; ")
  print(f"lr* = {law['coef']:.4g} * N^{law['exponent']:.3f} ({ci}optima within {law['tol']} "
        f"nats: [{lo:.3f}, {hi:.3f}])"
        + ("; WARNING: a best rate sits at the edge of the rates tried" if law["edge"] else ""))
  print(f"wrote {out}; the main grid reads it via --config.sweep.lr_law={out}")


if __name__ == "__main__":
  from absl import flags
  from transformer import cli
  flags.DEFINE_string("workdir", None, "The learning-rate sweep's directory.")
  flags.DEFINE_string("out", "", "Where to write the law (default DIR/lr_law.json).")
  flags.DEFINE_float("tol", 0.005, "Loss within this of the minimum counts as optimal (nats).")
  flags.DEFINE_float("noise_sd", 0.0, "Seed-to-seed sd of a final eval loss on this corpus "
                     "(nats): gives the exponent's 95% interval.")
  flags.DEFINE_integer("noise_dof", 0, "Degrees of freedom of --noise_sd.")
  flags.DEFINE_string("noise_from", "", "A grid's fit.json (experiments.scaling.fit) whose "
                      "measured seed noise (isoflop.seed_noise) gives --noise_sd/--noise_dof.")
  cli.run(main, required=("workdir",))
