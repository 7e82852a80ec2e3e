"""Scaling-law fits of a finished sweep: Chinchilla approaches 2 and 3, Kaplan L(N) and L(C).

  python -m experiments.scaling.fit --workdir DIR

reads DIR/sweep.json and every DIR/<run>/summary.json and writes DIR/fit.json, DIR/results.md
and the PNGs of experiments/scaling/plots.py. The functions below take plain arrays, so a
notebook can fit any (N, D, L) table without a sweep directory.

Conventions (README.md): N is all parameters, the tied embedding = output projection included
(Chinchilla / Porian et al. 2024), unless `--params=non_embedding` (Kaplan et al.); every
headline exponent is also reported in the other convention (fit.json `conventions.other`).
D is tokens trained on; C is training FLOPs, 6 N + 6 L T H hd per token with the same N. The
compute-optimal allocation of approach 3 uses C = 6ND, as Hoffmann et al. do; approach 2 reads
each run's FLOPs (attention included) off its IsoFLOP curve. E* (the known loss floor) comes
from the runs' summary.json `loss_floor` or --E_star.
"""

import itertools
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
import scipy.optimize  # noqa: E402

# Initial (a, b, e, alpha, beta) for approach 3. "hoffmann" is the grid of Hoffmann et al.
# 2022, appendix D.2 (6 * 6 * 5 * 5 * 5 = 4500 starts, ~20 s); "coarse" is a 36-start subset
# for quick looks and tests.
INIT_GRIDS = {
    "hoffmann": dict(a=np.arange(0, 26, 5.0), b=np.arange(0, 26, 5.0),
                     e=np.arange(-1, 1.01, 0.5), alpha=np.arange(0, 2.01, 0.5),
                     beta=np.arange(0, 2.01, 0.5)),
    "coarse": dict(a=[5.0, 10.0, 20.0], b=[5.0, 10.0, 20.0], e=[0.5], alpha=[0.5, 1.0],
                   beta=[0.5, 1.0]),
}

LAW_KEYS = ("E", "A", "B", "alpha", "beta")
_CI_PERCENTILES = (2.5, 97.5)  # 95% percentile-bootstrap intervals


def init_grid(name: str) -> np.ndarray:
  """[num_starts, 5] initial (a, b, e, alpha, beta)."""
  if name not in INIT_GRIDS:
    raise ValueError(f"unknown init grid {name!r}; valid: {sorted(INIT_GRIDS)}")
  g = INIT_GRIDS[name]
  return np.array(list(itertools.product(g["a"], g["b"], g["e"], g["alpha"], g["beta"])))


def _positive_arrays(fn: str, **arrays) -> list[np.ndarray]:
  out = [np.asarray(v, dtype=np.float64).ravel() for v in arrays.values()]
  sizes = {name: len(v) for name, v in zip(arrays, out)}
  if len(set(sizes.values())) != 1:
    raise ValueError(f"{fn}: arrays differ in length: {sizes}")
  for name, v in zip(arrays, out):
    if not np.all(np.isfinite(v) & (v > 0)):
      raise ValueError(f"{fn}: {name} must be finite and positive, got {v.tolist()}")
  return out


def power_law(x, y) -> tuple[float, float]:
  """Least squares in log-log space: y = k * x**slope. Returns (slope, k)."""
  slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
  return float(slope), float(np.exp(intercept))


# --- Approach 3: parametric L(N, D) = E + A/N^alpha + B/D^beta -------------------------------

def _huber_objective(theta, log_n, log_d, log_l, delta):
  """Sum of Huber(LSE(a - alpha log N, b - beta log D, e) - log L) and its gradient."""
  a, b, e, alpha, beta = theta
  z_n, z_d = a - alpha * log_n, b - beta * log_d
  m = np.maximum(np.maximum(z_n, z_d), e)  # shift so exp never overflows
  # Terms far below the largest are clipped at e^-200: denormal floats are ~100x slower on
  # x86 and change nothing at this scale.
  x_n, x_d, x_e = (np.exp(np.maximum(z - m, -200.0)) for z in (z_n, z_d, e))
  total = x_n + x_d + x_e
  r = m + np.log(total) - log_l
  dh = np.clip(r, -delta, delta)  # Huber'(r)
  value = np.sum(dh * (r - 0.5 * dh))  # r^2/2 inside delta, delta(|r| - delta/2) outside
  q = dh / total  # chain rule through the softmax weights x_i / total
  # Sums, not `@`: a threaded BLAS dot on a few hundred numbers spins its threads, which cost
  # 30x here on a loaded 2-core machine.
  q_n, q_d = q * x_n, q * x_d
  grad = np.array([q_n.sum(), q_d.sum(), (q * x_e).sum(), -(q_n * log_n).sum(),
                   -(q_d * log_d).sum()])
  return value, grad


def _lbfgs(x0, args):
  # The objective is ~1e-4 at the optimum, so scipy's default ftol (relative to max(|f|, 1))
  # would stop almost at once; Besiroglu et al. 2024 trace Hoffmann's biased fit to this.
  res = scipy.optimize.minimize(_huber_objective, x0, args=args, jac=True, method="L-BFGS-B",
                                options=dict(ftol=1e-12, gtol=1e-9, maxiter=2000))
  return res.x, float(res.fun)


def _law(theta) -> dict:
  a, b, e, alpha, beta = (float(t) for t in theta)
  return dict(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=alpha, beta=beta)


def predict_loss(law: dict, N, D):
  """L(N, D) of a fitted (or published) law."""
  N, D = np.asarray(N, np.float64), np.asarray(D, np.float64)
  return law["E"] + law["A"] / N ** law["alpha"] + law["B"] / D ** law["beta"]


def _allocation(law: dict) -> tuple[float, float, float]:
  """(G, a, b); NaN when an exponent is not positive, as then no interior optimum exists."""
  alpha, beta = law["alpha"], law["beta"]
  if not (alpha > 0 and beta > 0):
    return math.nan, math.nan, math.nan
  s = alpha + beta
  return (alpha * law["A"] / (beta * law["B"])) ** (1.0 / s), beta / s, alpha / s


def compute_optimal(law: dict, C) -> dict:
  """Minimizer of L(N, D) subject to C = 6ND: N_opt = G (C/6)^a, D_opt = (C/6)^b / G."""
  C = np.asarray(C, np.float64)
  G, a, b = _allocation(law)
  n_opt = G * (C / 6) ** a
  d_opt = (C / 6) ** b / G
  return dict(C=C, N_opt=n_opt, D_opt=d_opt, tokens_per_param=d_opt / n_opt,
              L_opt=predict_loss(law, n_opt, d_opt))


def _with_exponents(law: dict) -> dict:
  G, a, b = _allocation(law)
  return dict(law, a=a, b=b, G=G)


def _interval(values) -> list:
  # A resample can fit a non-positive exponent (NaN allocation); the interval is over the rest.
  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  return np.percentile(values, _CI_PERCENTILES).tolist() if len(values) else [math.nan] * 2


def _huber_fixed_e(theta4, e, log_n, log_d, log_l, delta):
  """The objective with e = log E held fixed: theta4 = (a, b, alpha, beta)."""
  a, b, alpha, beta = theta4
  value, grad = _huber_objective(np.array([a, b, e, alpha, beta]), log_n, log_d, log_l, delta)
  return value, grad[[0, 1, 3, 4]]


def _lbfgs_fixed(x0, e, args):
  res = scipy.optimize.minimize(_huber_fixed_e, x0, args=(e,) + tuple(args), jac=True,
                                method="L-BFGS-B",
                                options=dict(ftol=1e-12, gtol=1e-9, maxiter=2000))
  a, b, alpha, beta = res.x
  return np.array([a, b, e, alpha, beta]), float(res.fun)


def _best_fit(starts, args, e_fixed):
  if e_fixed is None:
    fits = [_lbfgs(x0, args) for x0 in starts]
  else:
    fits = [_lbfgs_fixed(x0[[0, 1, 3, 4]], e_fixed, args) for x0 in starts]
  return min(fits, key=lambda f: f[1] if np.isfinite(f[1]) else np.inf)


def fit_chinchilla(N, D, L, *, delta: float = 1e-3, grid: str = "hoffmann",
                   bootstrap: int = 0, seed: int = 0, budgets=(), E: float | None = None,
                   bootstrap_grid: str = "coarse") -> dict:
  """Hoffmann et al. approach 3: Huber fit of log L from every start of an init grid.

  Returns E, A, B, alpha, beta; a = beta/(alpha+beta) and b = alpha/(alpha+beta), the
  exponents of N_opt ~ C^a and D_opt ~ C^b; G; and, with `bootstrap` > 0, `ci` holding 95%
  intervals from refits on runs resampled with replacement. With `E` given, E is held there
  (the known loss floor E*) and four parameters are fitted. Each bootstrap refit starts
  afresh from every point of `bootstrap_grid` (plus the full fit's optimum), so a refit can
  leave the full fit's basin and an unidentified parameter shows as a wide interval, not a
  zero-width one; bootstrap_grid="optimum" restarts from the full fit only (fast, but
  conditional on that basin). With `budgets`, `optimal` lists N_opt, D_opt and tokens per
  parameter at each C (with intervals when bootstrapping).
  """
  N, D, L = _positive_arrays("fit_chinchilla", N=N, D=D, L=L)
  need = len(LAW_KEYS) - (E is not None)
  if len(N) < need:
    raise ValueError(f"fit_chinchilla needs at least {need} runs, got {len(N)}")
  if E is not None and not (0 < E < L.min()):
    raise ValueError(f"fixed E={E} must lie in (0, the smallest loss {L.min():.4g})")
  e_fixed = None if E is None else float(np.log(E))
  args = (np.log(N), np.log(D), np.log(L), delta)
  starts = init_grid(grid)
  theta, value = _best_fit(starts, args, e_fixed)
  out = _with_exponents(_law(theta))
  out.update(huber_loss=value, delta=delta, num_runs=len(N), grid=grid, num_starts=len(starts),
             E_fixed=E is not None,
             rms_log_residual=float(np.sqrt(np.mean(
                 (np.log(predict_loss(out, N, D)) - np.log(L)) ** 2))))
  samples = []
  if bootstrap:
    rng = np.random.default_rng(seed)
    restarts = [theta] if bootstrap_grid == "optimum" else \
        np.concatenate([init_grid(bootstrap_grid), [theta]])
    for _ in range(bootstrap):
      idx = rng.integers(0, len(N), len(N))
      t, _ = _best_fit(restarts, tuple(x[idx] for x in args[:3]) + (delta,), e_fixed)
      if np.all(np.isfinite(t)):
        samples.append(_with_exponents(_law(t)))
    out["bootstrap"] = len(samples)
    out["bootstrap_grid"] = bootstrap_grid
    out["bootstrap_degenerate"] = sum(not np.isfinite(s["a"]) for s in samples)
    out["ci"] = {k: _interval([s[k] for s in samples]) for k in LAW_KEYS + ("a", "b")}
  if len(budgets):
    best = compute_optimal(out, budgets)
    rows = []
    for i, c in enumerate(np.asarray(budgets, np.float64)):
      row = dict(C=float(c), N_opt=float(best["N_opt"][i]), D_opt=float(best["D_opt"][i]),
                 tokens_per_param=float(best["tokens_per_param"][i]),
                 L_opt=float(best["L_opt"][i]))
      if samples:
        opt = [compute_optimal(s, c) for s in samples]
        row["ci"] = {k: _interval([o[k] for o in opt])
                     for k in ("N_opt", "D_opt", "tokens_per_param")}
      rows.append(row)
    out["optimal"] = rows
  return out


def a_against_fixed_E(N, D, L, E_values, *, grid: str = "coarse") -> list[dict]:
  """Approach 3 with E held at each value: how much a (and the fit) depends on E."""
  rows = []
  for e in E_values:
    try:
      f = fit_chinchilla(N, D, L, grid=grid, E=float(e))
      rows.append(dict(E=float(e), a=f["a"], b=f["b"], alpha=f["alpha"], beta=f["beta"],
                       huber_loss=f["huber_loss"], rms_log_residual=f["rms_log_residual"]))
    except ValueError as err:
      rows.append(dict(E=float(e), error=str(err)))
  return rows


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
  C, N, L = _positive_arrays("fit_isoflop", C=C, N=N, L=L)
  D = None if D is None else _positive_arrays("fit_isoflop", C=C, D=D)[1]
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
  The bootstrap resamples seed noise: at a point with several seeds, the seeds with
  replacement; at a point with one, that loss plus Gaussian noise of the pooled seed
  standard deviation (`sigma`, from seed_noise() unless given); then every curve and both
  power laws are refitted, and `ci` holds 95% percentile intervals.
  """
  budget, N, L = _positive_arrays("fit_isoflop_local", budget=budget, N=N, L=L)
  logd = None if D is None else np.log10(_positive_arrays("fit_isoflop_local", N=N, D=D)[1])
  logc = None if C is None else np.log10(_positive_arrays("fit_isoflop_local", N=N, C=C)[1])
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
    sig = noise["sigma"] if sigma is None else sigma
    if not np.isfinite(sig):
      # No point has two seeds: the spread of the local parabolas' residuals stands in.
      def on(k):
        near = np.isclose(N[:, None], np.asarray(k["points"])[None, :], rtol=1e-9).any(axis=1)
        return (budget == k["C"]) & near
      res = [L[on(k)] - np.polyval(k["coef"], np.log10(N[on(k)]))
             for k in curves if "coef" in k]
      sig = float(np.sqrt(np.mean(np.concatenate(res) ** 2))) if res else 0.0
      out["seed_noise"]["sigma_from"] = "parabola residuals (no repeated seeds)"
    rng = np.random.default_rng(seed)
    keys = [(c, n) for c in np.unique(budget) for n in np.unique(N[budget == c])]
    samples = []
    for _ in range(bootstrap):
      L2 = L.copy()
      for c, n in keys:
        idx = np.flatnonzero((budget == c) & (N == n))
        if len(idx) >= 2:
          L2[idx] = L[rng.choice(idx, len(idx))]
        else:
          L2[idx] = L[idx] + rng.normal(0, sig, len(idx))
      L2 = np.maximum(L2, 1e-9)
      curves2 = _isoflop_local_once(budget, N, L2, logd, logc, points)
      samples.append((curves2, _power_laws(curves2)))
    out["bootstrap"] = bootstrap
    out["seed_noise"]["sigma_used"] = sig
    # An exponent the data give no point estimate of (fewer than two bracketed budgets) gets
    # no interval either, though some resamples might bracket two.
    out["ci"] = {k: _interval([p.get(k, math.nan) for _, p in samples]) if k in out
                 else [math.nan, math.nan] for k in ("a", "b")}
    for i, k in enumerate(curves):
      if "N_opt" in k:
        k["ci"] = {key: _interval([c2[i].get(key, math.nan) for c2, _ in samples])
                   for key in ("N_opt", "D_opt", "L_opt")}
  return out


# --- Kaplan et al. 2020: L(N) and the compute frontier L(C) -----------------------------------

def fit_kaplan(N, L) -> dict:
  """L(N) = (N_c / N)^alpha_N on the best loss reached at each model size."""
  N, L = _positive_arrays("fit_kaplan", N=N, L=L)
  sizes = np.unique(N)
  if len(sizes) < 2:
    raise ValueError(f"fit_kaplan needs at least 2 model sizes, got {len(sizes)}")
  best = np.array([L[N == n].min() for n in sizes])
  slope, k = power_law(sizes, best)
  alpha = -slope
  return dict(alpha_N=alpha, N_c=float(k ** (1.0 / alpha)), N=sizes.tolist(), L=best.tolist())


def lower_envelope(C, L) -> tuple[np.ndarray, np.ndarray]:
  """Points no run beats with less compute: the running minimum of loss over sorted C."""
  C, L = _positive_arrays("lower_envelope", C=C, L=L)
  order = np.argsort(C, kind="stable")
  C, L = C[order], L[order]
  keep = L < np.minimum.accumulate(np.concatenate([[np.inf], L[:-1]]))
  return C[keep], L[keep]


def fit_frontier(C, L) -> dict:
  """L(C) = (C_c / C)^alpha_C on the lower envelope of all (FLOPs, loss) points."""
  c_env, l_env = lower_envelope(C, L)
  if len(c_env) < 2:
    raise ValueError(f"fit_frontier needs at least 2 envelope points, got {len(c_env)}")
  slope, k = power_law(c_env, l_env)
  alpha = -slope
  return dict(alpha_C=alpha, C_c=float(k ** (1.0 / alpha)), C=c_env.tolist(), L=l_env.tolist())


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
  out["curves"], out["curve_metric"] = [], "eval_loss"
  for r, x in zip(rows, s):
    points = []
    path = os.path.join(workdir, r["name"], "metrics.jsonl")
    if os.path.exists(path):  # a torn last line is dropped with a warning naming the file
      points = metrics_file.read(path)
    flops_per_step = x["flops"] / max(x["step"], 1)
    evals = [(p["step"] * flops_per_step, p["eval_loss"]) for p in points
             if isinstance(p.get("eval_loss"), (int, float)) and p["step"] > 0]
    if not evals:
      out["curve_metric"] = "loss"
      evals = [(p["step"] * flops_per_step, p["loss"]) for p in points
               if isinstance(p.get("loss"), (int, float)) and p["step"] > 0]
    evals.append((x["flops"], x["final_eval_loss"]))
    out["curves"].append(np.array(sorted(evals)))
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
  kaplan = _try(fit_kaplan, runs["N"], runs["L"])
  curve_c = np.concatenate([c[:, 0] for c in runs["curves"]])
  curve_l = np.concatenate([c[:, 1] for c in runs["curves"]])
  frontier = _try(fit_frontier, curve_c, curve_l)
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
  with open(os.path.join(workdir, "fit.json"), "w") as f:
    json.dump(_json_safe(result), f, indent=2)
  with open(sweep.write_results(workdir), "a") as f:
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
  fmt_ci = lambda v: f" [{v[0]:.3f}, {v[1]:.3f}]" if v and None not in v else ""
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
      lines.append(f"| {k['C']:.3g} | {k['N_opt']:.3g}{fmt_ci(k.get('ci', {}).get('N_opt')).replace('.3f', '')} | "
                   f"{k.get('tokens_per_param', float('nan')):.1f} | "
                   f"{t3 if t3 is None else f'{t3:.1f}'} | {k['sizes_left']} / "
                   f"{k['sizes_right']}{'' if k.get('bracketed') else ' (add sizes)'} |")
  other = conv.get("other", {})
  if other:
    a2, a3 = other.get("a_approach2"), other.get("a_approach3")
    lines += ["", f"The same fits with N = {other['params']} parameters: approach 2 a = "
              f"{'n/a' if a2 is None else f'{a2:.3f}'}{fmt_ci(other.get('a_approach2_ci95'))}, "
              f"approach 3 a = {'n/a' if a3 is None or not np.isfinite(a3) else f'{a3:.3f}'}."]
  if "alpha_N" in kap:
    lines.append(f"Kaplan L(N) = (N_c/N)^alpha_N on the best loss per size: alpha_N = "
                 f"{kap['alpha_N']:.3f}.")
  if "alpha_C" in result["frontier"]:
    lines.append(f"Compute frontier L(C) = (C_c/C)^alpha_C: alpha_C = "
                 f"{result['frontier']['alpha_C']:.3f}.")
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
    print(f"E* = {result['E_star']:.4f}; approach 3 with E = E*: a = "
          f"{result.get('a_fixed_E_star')}")
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
  flags.DEFINE_integer("bootstrap", 200, "Bootstrap resamples for confidence intervals.")
  flags.DEFINE_integer("seed", 0, "Bootstrap seed.")
  flags.DEFINE_integer("min_layers", 1, "Leave runs with fewer layers out of the fits "
                       "(2 drops one-layer models, which sit off the trend).")
  cli.run(main, required=("workdir",))
