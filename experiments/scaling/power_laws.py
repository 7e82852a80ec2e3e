"""Power laws in log-log space and what the scaling fits share: the least-squares power law,
Kaplan et al. 2020's L(N) and compute frontier L(C), percentile-bootstrap intervals, and the
check that a fit's inputs are positive arrays of one length."""

import math

import numpy as np

CI_PERCENTILES = (2.5, 97.5)  # 95% percentile-bootstrap intervals


def positive_arrays(fn: str, **arrays) -> list[np.ndarray]:
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


def interval(values) -> list:
  # A resample can fit a non-positive exponent (NaN allocation); the interval is over the rest.
  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  return np.percentile(values, CI_PERCENTILES).tolist() if len(values) else [math.nan] * 2


# --- Kaplan et al. 2020: L(N) and the compute frontier L(C) -----------------------------------

def _scale(k: float, alpha: float) -> float:
  """X_c of y = (X_c / x)^alpha = k x^-alpha; inf where a resample's alpha is near 0."""
  with np.errstate(over="ignore", divide="ignore"):
    return float(np.exp(np.log(k) / alpha))


def _over_runs(fit_once, key, runs, bootstrap, seed) -> list:
  """95% percentile interval of fit_once(resampled runs)[key], resampling runs (whole ones,
  with replacement); a resample the fit refuses (e.g. one model size left) counts as NaN."""
  rng = np.random.default_rng(seed)
  values = []
  for _ in range(bootstrap):
    try:
      values.append(fit_once(rng.choice(runs, size=len(runs), replace=True))[key])
    except ValueError:
      values.append(math.nan)
  return interval(values)


def fit_kaplan(N, L, *, bootstrap: int = 0, seed: int = 0) -> dict:
  """L(N) = (N_c / N)^alpha_N on the best loss reached at each model size; with `bootstrap`,
  `ci` holds alpha_N's 95% interval over resamples of the runs (one (N, L) per run)."""
  N, L = positive_arrays("fit_kaplan", N=N, L=L)

  def once(rows):
    sizes = np.unique(N[rows])
    if len(sizes) < 2:
      raise ValueError(f"fit_kaplan needs at least 2 model sizes, got {len(sizes)}")
    best = np.array([L[rows][N[rows] == n].min() for n in sizes])
    slope, k = power_law(sizes, best)
    return dict(alpha_N=-slope, N_c=_scale(k, -slope), N=sizes.tolist(),
                L=best.tolist())

  out = once(np.arange(len(N)))
  if bootstrap:
    out["ci"] = dict(alpha_N=_over_runs(once, "alpha_N", np.arange(len(N)), bootstrap, seed))
  return out


def lower_envelope(C, L) -> tuple[np.ndarray, np.ndarray]:
  """Points no run beats with less compute: the running minimum of loss over sorted C."""
  C, L = positive_arrays("lower_envelope", C=C, L=L)
  order = np.argsort(C, kind="stable")
  C, L = C[order], L[order]
  keep = L < np.minimum.accumulate(np.concatenate([[np.inf], L[:-1]]))
  return C[keep], L[keep]


def fit_frontier(C, L, *, run=None, bootstrap: int = 0, seed: int = 0) -> dict:
  """L(C) = (C_c / C)^alpha_C on the lower envelope of all (FLOPs, loss) points. `run` names
  each point's run; with `bootstrap`, `ci` holds alpha_C's 95% interval over resamples of
  the runs, each drawn with its whole curve."""
  C, L = positive_arrays("fit_frontier", C=C, L=L)
  run = np.arange(len(C)) if run is None else np.asarray(run)

  def once(runs):
    rows = np.concatenate([np.flatnonzero(run == r) for r in runs])
    c_env, l_env = lower_envelope(C[rows], L[rows])
    if len(c_env) < 2:
      raise ValueError(f"fit_frontier needs at least 2 envelope points, got {len(c_env)}")
    slope, k = power_law(c_env, l_env)
    return dict(alpha_C=-slope, C_c=_scale(k, -slope), C=c_env.tolist(),
                L=l_env.tolist())

  out = once(np.unique(run))
  if bootstrap:
    out["ci"] = dict(alpha_C=_over_runs(once, "alpha_C", np.unique(run), bootstrap, seed))
  return out
