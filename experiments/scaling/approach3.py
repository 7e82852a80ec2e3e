"""Chinchilla's approach 3 (Hoffmann et al. 2022): the parametric law
L(N, D) = E + A/N^alpha + B/D^beta fitted by Huber loss on log L from a grid of starts, with E
free or fixed (E*, the known floor), bootstrap intervals that restart from the grid, and the
compute-optimal allocation it implies (C = 6 N D)."""

import itertools
import math

import numpy as np
import scipy.optimize

from experiments.scaling.power_laws import interval, positive_arrays

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


def init_grid(name: str) -> np.ndarray:
  """[num_starts, 5] initial (a, b, e, alpha, beta)."""
  if name not in INIT_GRIDS:
    raise ValueError(f"unknown init grid {name!r}; valid: {sorted(INIT_GRIDS)}")
  g = INIT_GRIDS[name]
  return np.array(list(itertools.product(g["a"], g["b"], g["e"], g["alpha"], g["beta"])))


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


# A fit that the grid does not identify (a small grid, a bootstrap resample) can run off to
# exponents where these overflow: the inf or NaN is the result (an unidentified parameter
# shows as a wide bootstrap interval, fit_chinchilla), and numpy's RuntimeWarnings in the
# middle of the output say nothing more.
_QUIET = dict(over="ignore", divide="ignore", invalid="ignore")


def _law(theta) -> dict:
  a, b, e, alpha, beta = (float(t) for t in theta)
  with np.errstate(**_QUIET):
    return dict(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=alpha,
                beta=beta)


def predict_loss(law: dict, N, D):
  """L(N, D) of a fitted (or published) law."""
  N, D = np.asarray(N, np.float64), np.asarray(D, np.float64)
  with np.errstate(**_QUIET):
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
  N, D, L = positive_arrays("fit_chinchilla", N=N, D=D, L=L)
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
    out["ci"] = {k: interval([s[k] for s in samples]) for k in LAW_KEYS + ("a", "b")}
  if len(budgets):
    best = compute_optimal(out, budgets)
    rows = []
    for i, c in enumerate(np.asarray(budgets, np.float64)):
      row = dict(C=float(c), N_opt=float(best["N_opt"][i]), D_opt=float(best["D_opt"][i]),
                 tokens_per_param=float(best["tokens_per_param"][i]),
                 L_opt=float(best["L_opt"][i]))
      if samples:
        opt = [compute_optimal(s, c) for s in samples]
        row["ci"] = {k: interval([o[k] for o in opt])
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
