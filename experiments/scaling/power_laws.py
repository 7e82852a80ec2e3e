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

def fit_kaplan(N, L) -> dict:
  """L(N) = (N_c / N)^alpha_N on the best loss reached at each model size."""
  N, L = positive_arrays("fit_kaplan", N=N, L=L)
  sizes = np.unique(N)
  if len(sizes) < 2:
    raise ValueError(f"fit_kaplan needs at least 2 model sizes, got {len(sizes)}")
  best = np.array([L[N == n].min() for n in sizes])
  slope, k = power_law(sizes, best)
  alpha = -slope
  return dict(alpha_N=alpha, N_c=float(k ** (1.0 / alpha)), N=sizes.tolist(), L=best.tolist())


def lower_envelope(C, L) -> tuple[np.ndarray, np.ndarray]:
  """Points no run beats with less compute: the running minimum of loss over sorted C."""
  C, L = positive_arrays("lower_envelope", C=C, L=L)
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
