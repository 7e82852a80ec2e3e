"""Chinchilla's approach 2: IsoFLOP curves. Each budget's minimum over N from a parabola in
log N (all points, or a local fit over the points nearest the minimum with a parametric
bootstrap of seed noise), then N_opt and D_opt against C as power laws."""

import math

import numpy as np

from experiments.scaling.power_laws import interval, positive_arrays, power_law


# --- Approach 2: IsoFLOP parabolas ------------------------------------------------------------

def fit_isoflop(C, N, L, D=None) -> dict:
  """Hoffmann et al. approach 2: per budget a parabola of L in log10 N, then power laws.

  C holds each run's nominal budget (runs with equal C form one IsoFLOP curve). D_opt at a
  budget is read off the curve's own log D vs log N line when D is given (so it honours
  whatever FLOPs convention set the budgets), else C / (6 N_opt).
  Returns `curves` (per budget: coefficients, N_opt, D_opt, L_opt) and the fits
  N_opt = N_coef * C^a, D_opt = D_coef * C^b over the budgets whose minimum lies inside their
  sampled sizes (when there are at least two).
  """
  C, N, L = positive_arrays("fit_isoflop", C=C, N=N, L=L)
  D = None if D is None else positive_arrays("fit_isoflop", C=C, D=D)[1]
  curves, skipped = [], []
  for c in np.unique(C):
    sel = C == c
    x = np.log10(N[sel])
    if len(np.unique(x)) < 3:
      skipped.append(dict(C=float(c), reason=f"{len(np.unique(x))} model sizes, need 3"))
      continue
    coef = np.polyfit(x, L[sel], 2)  # [c2, c1, c0]
    if coef[0] <= 0:
      skipped.append(dict(C=float(c), reason="parabola opens downward: no minimum"))
      continue
    x_opt = -coef[1] / (2 * coef[0])
    n_opt = 10.0 ** x_opt
    if D is not None:
      d_opt = 10.0 ** np.polyval(np.polyfit(x, np.log10(D[sel]), 1), x_opt)
    else:
      d_opt = c / (6 * n_opt)
    curves.append(dict(C=float(c), coef=coef.tolist(), N_opt=float(n_opt), D_opt=float(d_opt),
                       L_opt=float(np.polyval(coef, x_opt)), num_runs=int(sel.sum()),
                       inside=bool(x.min() <= x_opt <= x.max())))
  out = dict(curves=curves, skipped=skipped)
  # A minimum outside the sampled sizes is an extrapolation of the parabola, not a
  # measurement (Hoffmann et al. choose sizes so each budget's minimum is inside): the power
  # laws use only the budgets whose minimum was bracketed.
  inside = [k for k in curves if k["inside"]]
  out["power_law_budgets"] = [k["C"] for k in inside]
  if len(inside) >= 2:
    cs = [k["C"] for k in inside]
    out["a"], out["N_coef"] = power_law(cs, [k["N_opt"] for k in inside])
    out["b"], out["D_coef"] = power_law(cs, [k["D_opt"] for k in inside])
  return out


def _local_curve(x, y, logd, logc, points):
  """Parabola of y in x = log10 N over the `points` sizes nearest the measured minimum."""
  order = np.argsort(x)
  x, y = x[order], y[order]
  best = int(np.argmin(y))
  k = min(points, len(x))
  lo = min(max(0, best - k // 2), len(x) - k)
  sel = slice(lo, lo + k)
  coef = np.polyfit(x[sel], y[sel], 2)
  out = dict(coef=coef.tolist(), points=[float(10 ** v) for v in x[sel]],
             sizes_left=int(best), sizes_right=int(len(x) - 1 - best),
             measured_min=float(10 ** x[best]))
  if coef[0] <= 0:
    return dict(out, reason="parabola opens downward: no minimum")
  x_opt = -coef[1] / (2 * coef[0])
  out.update(N_opt=float(10 ** x_opt), L_opt=float(np.polyval(coef, x_opt)),
             inside=bool(x[sel].min() <= x_opt <= x[sel].max()))
  for key, values in (("D_opt", logd), ("C_opt", logc)):
    if values is not None:
      v = values[order]
      out[key] = float(10 ** np.polyval(np.polyfit(x[sel], v[sel], 1), x_opt))
  return out


def _isoflop_local_once(budget, N, L, logd, logc, points):
  curves = []
  for c in np.unique(budget):
    sel = budget == c
    sizes = np.unique(N[sel])
    if len(sizes) < 3:
      curves.append(dict(C=float(c), reason=f"{len(sizes)} model sizes, need 3"))
      continue
    mean = np.array([L[sel][N[sel] == n].mean() for n in sizes])
    first = lambda v: None if v is None else np.array([v[sel][N[sel] == n][0] for n in sizes])
    curve = _local_curve(np.log10(sizes), mean, first(logd), first(logc), points)
    curves.append(dict(C=float(c), **curve))
  return curves


def _power_laws(curves):
  # A budget whose measured minimum is its smallest or largest size has not bracketed its
  # optimum, even if the parabola's vertex falls inside: it stays out of the power laws.
  out = {}
  inside = [k for k in curves if k.get("inside") and k.get("sizes_left", 1) >= 1
            and k.get("sizes_right", 1) >= 1]
  out["power_law_budgets"] = [k["C"] for k in inside]
  if len(inside) >= 2:
    cs = [k.get("C_opt", k["C"]) for k in inside]
    out["a"], out["N_coef"] = power_law(cs, [k["N_opt"] for k in inside])
    if all("D_opt" in k for k in inside):
      out["b"], out["D_coef"] = power_law(cs, [k["D_opt"] for k in inside])
  return out


def seed_noise(budget, N, L) -> dict:
  """Pooled within-point standard deviation of the loss over seeds (points with >= 2 runs)."""
  ss, dof, groups = 0.0, 0, 0
  for c in np.unique(budget):
    for n in np.unique(N[budget == c]):
      y = L[(budget == c) & (N == n)]
      if len(y) >= 2:
        ss += float(((y - y.mean()) ** 2).sum())
        dof += len(y) - 1
        groups += 1
  return dict(sigma=float(np.sqrt(ss / dof)) if dof else math.nan, groups=groups, dof=dof)


def fit_isoflop_local(budget, N, L, D=None, C=None, *, points: int = 5, bootstrap: int = 0,
                      seed: int = 0, sigma: float | None = None) -> dict:
  """Approach 2 from local fits: per budget a parabola of the seed-mean loss in log10 N over
  the `points` sizes nearest its measured minimum, then N_opt ~ C^a, D_opt ~ C^b.

  `budget` groups runs into IsoFLOP curves; D and C (each run's tokens and FLOPs in the
  reported convention) are read off each curve at its vertex (log-linear in log N), so the
  power laws use the FLOPs of whichever convention C counts. Each curve reports how many
  sampled sizes lie left and right of its measured minimum (`bracketed`: >= 2 each side).
  The bootstrap is parametric: every run's loss plus Gaussian noise of the seed standard
  deviation, so a point's seed mean moves by sigma/sqrt(seeds) as a real one does (resampling
  two or three seeds with replacement would move it by only sqrt((n-1)/n) of that). sigma is
  `sigma` when given (taken as exact), else the pooled within-point sd of seed_noise(), else,
  with no repeated seeds, the local parabolas' residual sd on their degrees of freedom (points
  less 3 per parabola); an estimated sigma is redrawn per resample from its scaled chi-square
  distribution, so that the intervals carry its uncertainty as a t interval does. Every curve
  and both power laws are refitted per resample, and `ci` holds 95% percentile intervals.
  """
  budget, N, L = positive_arrays("fit_isoflop_local", budget=budget, N=N, L=L)
  logd = None if D is None else np.log10(positive_arrays("fit_isoflop_local", N=N, D=D)[1])
  logc = None if C is None else np.log10(positive_arrays("fit_isoflop_local", N=N, C=C)[1])
  curves = _isoflop_local_once(budget, N, L, logd, logc, points)
  for k in curves:
    if "N_opt" in k:
      k["bracketed"] = k["sizes_left"] >= 2 and k["sizes_right"] >= 2
      if "D_opt" in k:
        k["tokens_per_param"] = k["D_opt"] / k["N_opt"]
  out = dict(curves=curves, points=points, **_power_laws(curves))
  out["skipped"] = [dict(C=k["C"], reason=k["reason"]) for k in curves if "reason" in k]
  noise = seed_noise(budget, N, L)
  out["seed_noise"] = noise
  if bootstrap:
    sig, dof = noise["sigma"], noise["dof"]
    if sigma is not None:
      sig, dof = float(sigma), math.inf
    elif not np.isfinite(sig):
      # No point has two seeds: the spread of the local parabolas' residuals stands in.
      def on(k):
        near = np.isclose(N[:, None], np.asarray(k["points"])[None, :], rtol=1e-9).any(axis=1)
        return (budget == k["C"]) & near
      res = [L[on(k)] - np.polyval(k["coef"], np.log10(N[on(k)]))
             for k in curves if "coef" in k]
      dof = sum(len(r) - 3 for r in res)
      sig = float(np.sqrt(sum(float((r ** 2).sum()) for r in res) / dof)) if dof > 0 else math.nan
      out["seed_noise"]["sigma_from"] = "parabola residuals (no repeated seeds)"
    if not np.isfinite(sig):
      # Three points per parabola and one seed each leave no residual to estimate noise from:
      # no interval rather than a zero-width one.
      out["seed_noise"]["sigma_from"] = "none (one seed per point, 3 points per parabola)"
      return out
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(bootstrap):
      s = sig if math.isinf(dof) else sig * math.sqrt(dof / rng.chisquare(dof))
      L2 = L + rng.normal(0, s, len(L))
      L2 = np.maximum(L2, 1e-9)
      curves2 = _isoflop_local_once(budget, N, L2, logd, logc, points)
      samples.append((curves2, _power_laws(curves2)))
    out["bootstrap"] = bootstrap
    out["seed_noise"]["sigma_used"] = sig
    out["seed_noise"]["sigma_dof"] = dof if math.isfinite(dof) else None
    # An exponent the data give no point estimate of (fewer than two bracketed budgets) gets
    # no interval either, though some resamples might bracket two.
    out["ci"] = {k: interval([p.get(k, math.nan) for _, p in samples]) if k in out
                 else [math.nan, math.nan] for k in ("a", "b")}
    for i, k in enumerate(curves):
      if "N_opt" in k:
        k["ci"] = {key: interval([c2[i].get(key, math.nan) for c2, _ in samples])
                   for key in ("N_opt", "D_opt", "L_opt")}
  return out
