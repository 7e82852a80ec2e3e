"""Kaplan et al. 2020's power laws: L(N) on the best loss per size, the compute frontier L(C)
on the lower envelope of every curve, and their intervals over resamples of the runs."""

import numpy as np
import pytest

from experiments.scaling import power_laws


def _kaplan_runs(rng):
  sizes = np.repeat(np.geomspace(1e6, 1e9, 7), 3)
  # Each size has its converged run and two worse (e.g. shorter) ones; only the best counts.
  loss = (8.8e13 / sizes) ** 0.076 * np.tile([1.0, 1.05, 1.2], 7)
  return sizes, loss * np.exp(rng.normal(0, 1e-3, sizes.size))


def test_kaplan_recovers_alpha_n_and_frontier():
  # Kaplan et al. 2020 eq. 1.1 and 1.4 exponents: alpha_N = 0.076, alpha_C^min = 0.050.
  rng = np.random.default_rng(0)
  sizes, loss = _kaplan_runs(rng)
  got = power_laws.fit_kaplan(sizes, loss)
  assert got["alpha_N"] == pytest.approx(0.076, abs=0.005)
  assert len(got["N"]) == 7
  flops = np.geomspace(1e15, 1e20, 30)
  on_law = (3.1e8 * 8.64e19 / flops) ** 0.050  # C_c = 3.1e8 PF-days in FLOPs
  above = on_law * (1 + rng.uniform(0.01, 0.3, 30))
  got = power_laws.fit_frontier(np.concatenate([flops, flops * 1.1]),
                                np.concatenate([on_law, above]))
  assert got["alpha_C"] == pytest.approx(0.050, abs=1e-3)
  c_env, l_env = power_laws.lower_envelope([1, 2, 3, 4], [5, 6, 4, 4.5])
  np.testing.assert_array_equal(c_env, [1, 3])


def test_intervals_over_runs_cover_the_law_and_shrink_with_less_noise():
  rng = np.random.default_rng(1)
  sizes, loss = _kaplan_runs(rng)
  got = power_laws.fit_kaplan(sizes, loss, bootstrap=200, seed=0)
  lo, hi = got["ci"]["alpha_N"]
  assert lo <= got["alpha_N"] <= hi and lo < 0.076 < hi
  assert power_laws.fit_kaplan(sizes, loss, bootstrap=200, seed=0)["ci"] == got["ci"]
  # Curves: each run's points move together in a resample, so a run is kept or dropped whole.
  flops = np.geomspace(1e15, 1e20, 12)
  runs = [(flops[i:i + 4], (2.7e28 / flops[i:i + 4]) ** 0.05 * (1 + 0.02 * rng.random()))
          for i in range(0, 9)]
  C = np.concatenate([c for c, _ in runs])
  L = np.concatenate([l for _, l in runs])
  run = np.concatenate([np.full(4, i) for i in range(len(runs))])
  noisy = power_laws.fit_frontier(C, L, run=run, bootstrap=200, seed=0)
  lo, hi = noisy["ci"]["alpha_C"]
  assert lo <= noisy["alpha_C"] <= hi and hi - lo > 1e-4
  exact = power_laws.fit_frontier(C, (2.7e28 / C) ** 0.05, run=run, bootstrap=200, seed=0)
  assert exact["ci"]["alpha_C"] == pytest.approx([0.05, 0.05], abs=1e-9)
