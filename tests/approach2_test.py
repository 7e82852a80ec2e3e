"""experiments/scaling/approach2.py's parametric bootstrap: an estimated seed noise carries its
own uncertainty into the intervals (sigma redrawn as sigma * sqrt(dof / chi2_dof))."""

import numpy as np
import pytest

from experiments.scaling import approach2, fit

LAW = dict(E=0.8, A=60.0, B=300.0, alpha=0.45, beta=0.4)


def _grid(rng):
  """Four IsoFLOP budgets of 6 sizes 10^0.2 apart around their optimum, one seed each and a
  second seed at three points: the seed noise is estimated on 3 degrees of freedom."""
  budget, n, loss = [], [], []
  for c in np.geomspace(1e12, 1e14, 4):
    centre = fit.compute_optimal(LAW, c)["N_opt"]
    for k, size in enumerate(centre * 10 ** (0.2 * (np.arange(6) - 2.5))):
      for _ in range(2 if c == 1e12 and 1 <= k <= 3 else 1):
        budget.append(c), n.append(size)
        loss.append(fit.predict_loss(LAW, size, c / (6 * size)) * np.exp(rng.normal(0, 0.004)))
  return np.array(budget), np.array(n), np.array(loss)


def test_an_estimated_noise_widens_the_intervals_as_a_t_interval_does():
  budget, n, loss = _grid(np.random.default_rng(0))
  estimated = approach2.fit_isoflop_local(budget, n, loss, bootstrap=400, seed=0)
  assert estimated["seed_noise"]["dof"] == 3
  sigma = estimated["seed_noise"]["sigma"]
  exact = approach2.fit_isoflop_local(budget, n, loss, bootstrap=400, seed=0, sigma=sigma)
  width = lambda fit: np.diff(fit["ci"]["a"])[0]
  # sigma * sqrt(3 / chi2_3) has E[s^2] = 3 sigma^2: markedly wider than sigma taken as exact.
  assert width(estimated) > 1.3 * width(exact), (width(estimated), width(exact))


def _parabola_runs(budgets, x_opts, offsets=(-0.4, -0.2, 0.0, 0.2, 0.4)):
  """Runs whose loss is exactly 2 + 0.3 (log10 N - x_opt)^2 at sizes around each x_opt."""
  C, N, L = [], [], []
  for c, x0 in zip(budgets, x_opts):
    for dx in offsets:
      C.append(c), N.append(10 ** (x0 + dx)), L.append(2.0 + 0.3 * dx ** 2)
  return np.array(C), np.array(N), np.array(L)


def test_fit_isoflop_reads_the_vertex_and_d_opt_is_c_over_6n():
  """Exact parabolas in log10 N: N_opt is the vertex and, without D, D_opt = C / (6 N_opt)
  (Kaplan/Hoffmann C = 6 N D); with D = C / (2 N) given, D_opt follows that convention."""
  budgets, xs = [1e18, 1e19, 1e20], [8.0, 8.5, 9.0]
  C, N, L = _parabola_runs(budgets, xs)
  out = approach2.fit_isoflop(C, N, L)
  assert len(out["curves"]) == 3
  for curve, c, x0 in zip(out["curves"], budgets, xs):
    assert curve["N_opt"] == pytest.approx(10 ** x0, rel=1e-6)
    assert curve["D_opt"] == pytest.approx(c / (6 * 10 ** x0), rel=1e-6)
    assert curve["L_opt"] == pytest.approx(2.0, abs=1e-9) and curve["inside"]
  assert out["a"] == pytest.approx(0.5, abs=1e-6) and out["b"] == pytest.approx(0.5, abs=1e-6)
  with_d = approach2.fit_isoflop(C, N, L, D=C / (2 * N))
  for curve, c, x0 in zip(with_d["curves"], budgets, xs):
    assert curve["D_opt"] == pytest.approx(c / (2 * 10 ** x0), rel=1e-6)
