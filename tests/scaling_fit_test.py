"""Scaling-law fits recover published laws; the sweep-directory CLI writes its outputs.

Published laws (L = E + A/N^alpha + B/D^beta, N parameters, D tokens):
  Hoffmann et al. 2022 (Chinchilla), eq. 10: E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28.
  Besiroglu et al. 2024 ("Chinchilla Scaling: A replication attempt") refit:
    E=1.82, A=482.0, B=2085.4, alpha=0.348, beta=0.366.
The compute-optimal numbers asserted below were computed for this file from those parameters
with C = 6ND, by closed form and checked by direct numerical minimization (test below):
  Hoffmann: a = 0.28/0.62 = 0.4516, b = 0.5484 (the paper's table 3 gives 0.46 / 0.54 from
    unrounded parameters).
  Besiroglu: a = 0.366/0.714 = 0.5126; at Chinchilla's budget C = 5.76e23, N_opt = 7.23e10
    (Chinchilla has 70B parameters) and D_opt / N_opt = 18.4 tokens per parameter (Chinchilla
    trained 1.4T tokens, 20 per parameter).
"""

import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
import scipy.optimize

from experiments.scaling import fit
from launch import sweep

HOFFMANN = dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
BESIROGLU = dict(E=1.82, A=482.0, B=2085.4, alpha=0.348, beta=0.366)
CHINCHILLA_C = 5.76e23
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_init_grid_is_hoffmanns_appendix_d2():
  grid = fit.init_grid("hoffmann")
  assert grid.shape == (6 * 6 * 5 * 5 * 5, 5)
  a, b, e, alpha, beta = (np.unique(grid[:, i]) for i in range(5))
  np.testing.assert_allclose(a, [0, 5, 10, 15, 20, 25])
  np.testing.assert_allclose(b, a)
  np.testing.assert_allclose(e, [-1, -0.5, 0, 0.5, 1])
  np.testing.assert_allclose(alpha, [0, 0.5, 1, 1.5, 2])
  np.testing.assert_allclose(beta, alpha)
  coarse = {tuple(x) for x in fit.init_grid("coarse")}
  assert coarse <= {tuple(x) for x in grid}
  with pytest.raises(ValueError, match="valid: .*hoffmann"):
    fit.init_grid("fine")


@pytest.mark.parametrize("law", [HOFFMANN, BESIROGLU], ids=["hoffmann", "besiroglu"])
def test_compute_optimal_matches_numerical_minimum(law):
  for c in (1e20, CHINCHILLA_C):
    best = fit.compute_optimal(law, c)
    # Independent route: minimize L(N, C/(6N)) over log N directly.
    res = scipy.optimize.minimize_scalar(
        lambda x: fit.predict_loss(law, np.exp(x), c / (6 * np.exp(x))),
        bounds=(np.log(1e6), np.log(1e13)), method="bounded", options=dict(xatol=1e-10))
    np.testing.assert_allclose(best["N_opt"], np.exp(res.x), rtol=1e-4)
    np.testing.assert_allclose(6 * best["N_opt"] * best["D_opt"], c, rtol=1e-12)


def test_published_compute_optimal_allocations():
  hoff = fit._with_exponents(HOFFMANN)
  assert hoff["a"] == pytest.approx(0.4516, abs=1e-4)
  assert hoff["b"] == pytest.approx(0.5484, abs=1e-4)
  besi = fit._with_exponents(BESIROGLU)
  assert besi["a"] == pytest.approx(0.5126, abs=1e-4)
  opt = fit.compute_optimal(BESIROGLU, CHINCHILLA_C)
  assert opt["N_opt"] == pytest.approx(7.23e10, rel=0.01)
  assert opt["tokens_per_param"] == pytest.approx(18.4, abs=0.1)


def test_non_positive_exponent_has_no_allocation():
  # Small noisy sweeps can fit beta <= 0 (loss not falling with data): no interior optimum.
  law = dict(HOFFMANN, beta=-0.1)
  assert np.isnan(fit._with_exponents(law)["a"])
  assert np.isnan(fit.compute_optimal(law, 1e20)["N_opt"])
  assert fit._json_safe({"x": [np.nan, np.float64(1.0)], "n": np.int64(3)}) == \
      {"x": [None, 1.0], "n": 3}


def _chinchilla_design(law, seed, noise=0.002):
  """Sizes 3e7..1e10 each trained on 2..200 tokens per parameter, like Hoffmann's runs."""
  rng = np.random.default_rng(seed)
  n = np.repeat(np.geomspace(3e7, 1e10, 8), 6)
  d = n * np.tile(np.geomspace(2, 200, 6), 8)
  loss = fit.predict_loss(law, n, d) * np.exp(rng.normal(0, noise, n.size))
  return n, d, loss


@pytest.mark.slow
@pytest.mark.parametrize("law", [HOFFMANN, BESIROGLU], ids=["hoffmann", "besiroglu"])
def test_fit_chinchilla_recovers_law(law):
  n, d, loss = _chinchilla_design(law, seed=1)
  got = fit.fit_chinchilla(n, d, loss, grid="coarse", bootstrap=20, budgets=[CHINCHILLA_C])
  assert got["E"] == pytest.approx(law["E"], abs=0.03)
  assert got["alpha"] == pytest.approx(law["alpha"], abs=0.02)
  assert got["beta"] == pytest.approx(law["beta"], abs=0.02)
  assert got["A"] == pytest.approx(law["A"], rel=0.2)
  assert got["B"] == pytest.approx(law["B"], rel=0.2)
  want = fit._with_exponents(law)
  assert got["a"] == pytest.approx(want["a"], abs=0.015)
  assert got["b"] == pytest.approx(1 - got["a"])
  assert got["rms_log_residual"] < 0.003  # noise is 0.002
  for key in ("E", "alpha", "beta", "a", "b"):
    lo, hi = got["ci"][key]
    assert lo <= got[key] <= hi, key
  opt = got["optimal"][0]
  true_ratio = fit.compute_optimal(law, CHINCHILLA_C)["tokens_per_param"]
  assert opt["tokens_per_param"] == pytest.approx(true_ratio, rel=0.25)
  assert opt["ci"]["N_opt"][0] <= opt["N_opt"] <= opt["ci"]["N_opt"][1]


def test_fit_chinchilla_rejects_bad_input():
  with pytest.raises(ValueError, match="differ in length"):
    fit.fit_chinchilla([1e6, 1e7], [1e9], [3.0, 2.5])
  with pytest.raises(ValueError, match="L must be finite and positive"):
    fit.fit_chinchilla([1e6] * 5, [1e9] * 5, [3, 2, np.nan, 2, 2])
  with pytest.raises(ValueError, match="at least 5 runs"):
    fit.fit_chinchilla([1e6, 1e7], [1e9, 1e9], [3.0, 2.5])


def _isoflop_grid(seeds, sizes=5, noise=0.01, rng_seed=0):
  """Every budget's `sizes` sizes around Hoffmann's optimum, `seeds` runs each, additive noise."""
  budget, n = [], []
  for c in (1e17, 1e18, 1e19, 1e20):
    centre = fit.compute_optimal(HOFFMANN, c)["N_opt"]
    for size in centre * np.logspace(-0.6, 0.6, sizes):
      budget += [c] * seeds
      n += [size] * seeds
  budget, n = np.array(budget), np.array(n)
  d = budget / (6 * n)
  loss = fit.predict_loss(HOFFMANN, n, d)
  return budget, n, d, loss + np.random.default_rng(rng_seed).normal(0, noise, len(n))


def test_approach_2_noise_from_residuals_counts_their_degrees_of_freedom():
  """One seed per point: sigma is the residual sd of the parabolas on points - 3 per parabola
  (their mean square alone reads sqrt(2/5) of the noise with 5 points each, and the intervals
  cover ~75% of the time)."""
  budget, n, d, loss = _isoflop_grid(seeds=1)
  got = fit.fit_isoflop_local(budget, n, loss, d, budget, bootstrap=20)
  ssr = sum(np.polyfit(np.log10(n[budget == c]), loss[budget == c], 2, full=True)[1][0]
            for c in np.unique(budget))
  assert got["seed_noise"]["sigma_dof"] == 4 * (5 - 3)
  assert got["seed_noise"]["sigma_used"] == pytest.approx(np.sqrt(ssr / 8), rel=1e-9)
  # Three points per parabola leave no residual: no interval, not a zero-width one.
  three = fit.fit_isoflop_local(*_isoflop_grid(seeds=1, sizes=3)[:3], bootstrap=20)
  assert "ci" not in three and "none" in three["seed_noise"]["sigma_from"]


def test_approach_2_bootstrap_moves_a_seed_mean_by_sigma_over_root_seeds():
  """Three seeds per point must give the intervals of one run per point at the seed mean with
  noise sigma/sqrt(3); resampling the seeds with replacement gave ~0.8 of that width."""
  budget, n, d, loss = _isoflop_grid(seeds=3)
  seeded = fit.fit_isoflop_local(budget, n, loss, d, budget, bootstrap=1000, seed=1)
  one = np.arange(0, len(n), 3)
  sigma = seeded["seed_noise"]["sigma"]
  assert sigma == pytest.approx(0.01, rel=0.25)
  means = fit.fit_isoflop_local(budget[one], n[one], loss.reshape(-1, 3).mean(1), d[one],
                                budget[one], bootstrap=1000, seed=2, sigma=sigma / np.sqrt(3))
  log_width = lambda ci: np.log(ci[1] / ci[0])
  ratios = [log_width(a["ci"][key]) / log_width(b["ci"][key])
            for a, b in zip(seeded["curves"], means["curves"]) for key in ("N_opt", "L_opt")]
  assert np.exp(np.mean(np.log(ratios))) == pytest.approx(1.0, abs=0.08)


def test_isoflop_recovers_exponent():
  # IsoFLOP curves of Hoffmann's law, 7 sizes spanning 16x around each budget's optimum.
  rng = np.random.default_rng(0)
  c, n, loss = [], [], []
  for budget in np.geomspace(1e18, 1e21, 4):
    centre = fit.compute_optimal(HOFFMANN, budget)["N_opt"]
    for size in centre * np.geomspace(1 / 4, 4, 7):
      c.append(budget)
      n.append(size)
      loss.append(fit.predict_loss(HOFFMANN, size, budget / (6 * size)) *
                  np.exp(rng.normal(0, 1e-3)))
  d = np.array(c) / (6 * np.array(n))
  got = fit.fit_isoflop(c, n, loss, d)
  assert got["a"] == pytest.approx(0.28 / 0.62, abs=0.01)
  assert got["b"] == pytest.approx(0.34 / 0.62, abs=0.01)
  assert all(curve["inside"] for curve in got["curves"])
  # A budget sampled only on one side of its optimum: its parabola's minimum is an
  # extrapolation, so it is kept as a curve but left out of the power laws.
  shifted_n = [x * (16 if i >= 21 else 1) for i, x in enumerate(n)]
  got = fit.fit_isoflop(c, shifted_n, loss[:21] + [
      fit.predict_loss(HOFFMANN, x, 1e21 / (6 * x)) for x in shifted_n[21:]])
  assert [k["inside"] for k in got["curves"]] == [True, True, True, False]
  assert got["power_law_budgets"] == [k["C"] for k in got["curves"][:3]]
  assert got["a"] == pytest.approx(0.28 / 0.62, abs=0.01)
  # Too few sizes for a parabola: that budget is skipped, with the reason.
  got = fit.fit_isoflop(c[:9], n[:9], loss[:9])
  assert len(got["curves"]) == 1 and "need 3" in got["skipped"][0]["reason"]


def test_results_md_says_which_budgets_approach_2_left_out(tmp_path):
  # Three budgets on Hoffmann's law and a fourth whose losses bend the wrong way: its
  # parabola opens downward, so it has no row in the table and results.md must say why.
  c, n, loss = [], [], []
  for budget in (1e18, 1e19, 1e20):
    centre = fit.compute_optimal(HOFFMANN, budget)["N_opt"]
    for size in centre * np.geomspace(1 / 4, 4, 5):
      c.append(budget)
      n.append(size)
      loss.append(fit.predict_loss(HOFFMANN, size, budget / (6 * size)))
  for i, size in enumerate(np.geomspace(1e9, 1e10, 5)):
    c.append(1e21)
    n.append(size)
    loss.append(2.0 - 0.01 * (i - 2) ** 2)
  iso = fit.fit_isoflop_local(c, n, loss, np.array(c) / (6 * np.array(n)), bootstrap=20)
  assert [k["C"] for k in iso["skipped"]] == [1e21]
  result = dict(num_runs=len(c), params="total", excluded_runs=[], min_layers=1,
                chinchilla={}, isoflop=iso, kaplan={}, frontier={})
  text = fit.fit_markdown(result, str(tmp_path))
  rows = [line for line in text.splitlines() if line.startswith("| 1e+")]
  assert [line.split("|")[1].strip() for line in rows] == ["1e+18", "1e+19", "1e+20"]
  # N_opt and its interval in 3 significant digits, like the other cells.
  n_opt = iso["curves"][0]
  assert rows[0].split("|")[2].strip() == (f"{n_opt['N_opt']:.3g} [{n_opt['ci']['N_opt'][0]:.3g}, "
                                           f"{n_opt['ci']['N_opt'][1]:.3g}]")
  assert "Left out of approach 2: 1e+21 (parabola opens downward: no minimum)." in text


def _fake_sweep(workdir, law, noise=0.003, budgets="1e12,4e12,1.6e13"):
  """A finished IsoFLOP sweep whose losses follow `law`, as launch.local would leave it."""
  config = ml_collections.ConfigDict(dict(
      model=dict(kind="decoder", vocab_size=256, ffn="gelu", tie_embeddings=True,
                 d_model=64, num_layers=2, num_heads=2, num_kv_heads=0, head_dim=0, d_ff=256),
      data=dict(seq_len=128), train=dict(steps=10, batch_size=8, eval_every=100),
      sweep=sweep.default_config()))
  config.sweep.update(kind="scaling", sizes="5e4,1e5,2e5,4e5,8e5", budgets=budgets)
  runs = sweep.expand(config)
  sweep.write_sweep_json(workdir, config, runs, ["test"])
  rng = np.random.default_rng(0)
  for run in runs[:-1]:  # the last run "did not finish"
    run_dir = os.path.join(workdir, run["name"])
    os.makedirs(run_dir)
    n, steps = run["params_non_embedding"], run["overrides"]["train.steps"]
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
      for step in (steps // 4, steps // 2, steps):
        tokens = run["tokens"] * step / steps
        f.write(json.dumps(dict(step=step, loss=9.0,
                                eval_loss=float(fit.predict_loss(law, n, tokens)))) + "\n")
    summary = dict(final_eval_loss=float(fit.predict_loss(law, n, run["tokens"]) *
                                         np.exp(rng.normal(0, noise))),
                   params_total=run["params_total"], params_non_embedding=n,
                   tokens=run["tokens"], flops=run["flops"],
                   flops_per_token=run["flops_per_token"], wall_time_s=12.0, step=steps,
                   config={**run["overrides"], "opt.lr": 1e-3})
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
      json.dump(summary, f)
  return runs


@pytest.mark.slow
def test_fit_cli_on_a_sweep_directory(tmp_path):
  workdir = str(tmp_path / "sweep")
  runs = _fake_sweep(workdir, HOFFMANN)
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.scaling.fit", f"--workdir={workdir}",
       "--grid=coarse", "--bootstrap=5"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(os.path.join(workdir, "fit.json")) as f:
    result = json.load(f)
  for key in ("E", "A", "B", "alpha", "beta", "a", "b"):
    assert np.isfinite(result[key]), key
  assert result["num_runs"] == len(runs) - 1
  assert len(result["isoflop"]["curves"]) == 3
  assert result["frontier"]["metric"] == "eval_loss"
  for png in ("isoflop.png", "optimal.png", "frontier.png", "contours.png"):
    assert os.path.getsize(os.path.join(workdir, png)) > 10_000, png
  with open(os.path.join(workdir, "results.md")) as f:
    text = f.read()
  table = text.split("\n\n")[0].splitlines()  # the runs table, then the fits
  assert "## Fits" in text and "Approach 3" in text
  assert "model.d_model" in table[0] and "train.steps" in table[0]
  assert "opt.lr" not in table[0]  # the same in every run
  losses = [float(line.split("|")[-6]) for line in table[2:-1]]
  assert losses == sorted(losses)
  assert table[-1].startswith(f"| {runs[-1]['name']} |") and "not finished" in table[-1]


@pytest.mark.slow
def test_min_layers_leaves_shallow_runs_out_of_the_fits(tmp_path):
  workdir = str(tmp_path / "sweep")
  runs = _fake_sweep(workdir, HOFFMANN)[:-1]
  shallow = [r["name"] for r in runs if r["overrides"]["model.num_layers"] < 2]
  assert shallow and len(shallow) < len(runs)
  result = fit.fit_sweep(workdir, grid="coarse", bootstrap=0, plots=False, min_layers=2)
  assert result["excluded_runs"] == shallow
  assert result["num_runs"] == len(runs) - len(shallow)
  assert fit.fit_sweep(workdir, grid="coarse", bootstrap=0, plots=False)["excluded_runs"] == []


def test_fit_cli_without_finished_runs_is_one_line(tmp_path):
  (tmp_path / "started").mkdir()  # a run that never finished: no summary.json
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.scaling.fit", f"--workdir={tmp_path}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      f"error: no finished runs (DIR/<run>/summary.json) under {tmp_path}; point --workdir at "
      f"a sweep directory whose runs have finished"]
  assert not (tmp_path / "fit.json").exists()


@pytest.mark.slow
def test_ablation_table_measures_the_change_in_a(tmp_path):
  # experiments.scaling.ablation: two grids whose losses follow laws with known a =
  # beta / (alpha + beta) (0.452, then 0.513); the table recovers both and their difference.
  from experiments.scaling import ablation
  first, second = str(tmp_path / "ablation"), str(tmp_path / "corrected")
  _fake_sweep(first, HOFFMANN, noise=1e-4)
  _fake_sweep(second, BESIROGLU, noise=1e-4)
  table = ablation.ablation_table([first, second], bootstrap=4)
  assert table["budgets"] == [1e12, 4e12, 1.6e13]
  original, recounted, corrected = table["rows"]
  # Rows are labelled by what their runs trained with, not by their directories' names.
  assert original["step"].startswith("original: lr 0.001, ") and "one seed" in original["step"]
  assert recounted["params"] == "total" and corrected["step"] == "+ (same settings)"
  want = lambda law: law["beta"] / (law["alpha"] + law["beta"])
  assert original["a3"] == pytest.approx(want(HOFFMANN), abs=0.03)
  assert corrected["a3"] == pytest.approx(want(BESIROGLU), abs=0.03)
  # Changes are from the grid above, never from the analysis-only refit between them.
  assert corrected["delta_a3"] == pytest.approx(corrected["a3"] - original["a3"])
  assert recounted["delta_a3"] == pytest.approx(recounted["a3"] - original["a3"])
  assert "| grid | N counted |" in ablation.markdown(table)
  before = dict(lr="lr 0.003", warmup="warmup 50", beta2="beta2 0.95")
  assert ablation.label(before, {**before, "lr": "lr(N) law"}) == "+ lr(N) law"
  assert ablation.label(None, before) == "original: lr 0.003, warmup 50, beta2 0.95"


@pytest.mark.slow
def test_ablation_refits_approach_2_on_the_budgets_every_grid_brackets(tmp_path):
  # Two grids of one law; the second lost three of its five runs at 2e11, so its approach 2
  # drops that budget. Compared as fitted, the two a's differ by their budgets alone; the
  # refit on the shared budgets must equal each grid's own fit restricted to them.
  from experiments.scaling import ablation
  first, second = str(tmp_path / "first"), str(tmp_path / "second")
  budgets = "2e11,5e11,1e12,2e12"
  _fake_sweep(first, HOFFMANN, noise=1e-4, budgets=budgets)
  runs = _fake_sweep(second, HOFFMANN, noise=1e-4, budgets=budgets)
  for run in [r for r in runs if r["budget"] == 2e11][:3]:
    os.remove(os.path.join(second, run["name"], "summary.json"))
  table = ablation.ablation_table([first, second], bootstrap=0)
  original, recounted, other = table["rows"]
  assert original["a2_budgets"] == [2e11, 5e11, 1e12, 2e12]
  assert other["a2_budgets"] == [5e11, 1e12, 2e12]
  assert table["common_a2_budgets"] == [5e11, 1e12, 2e12]
  assert other["a2_common"] == pytest.approx(other["a2"])  # already on the shared budgets
  runs = ablation._runs(first, "non_embedding", [5e11, 1e12, 2e12])
  alone = fit.fit_isoflop_local(runs["budget"], runs["N_non_embedding"], runs["L"], runs["D"],
                                runs["C_non_embedding"], bootstrap=0)
  assert original["a2_common"] == pytest.approx(alone["a"])
  assert original["a2_common"] != pytest.approx(original["a2"], abs=1e-6)
  assert other["delta_a2_common"] == pytest.approx(other["a2_common"] - original["a2_common"])
  text = ablation.markdown(table)
  assert "refitted on the budgets every grid brackets (5e+11, 1e+12, 2e+12)" in text
  assert "| 2e+11, 5e+11, 1e+12, 2e+12 |" in text
  for row in (original, other):  # the seed mean at the best size, each budget
    runs = fit.load_runs(row["workdir"], "non_embedding")
    for c in table["budgets"]:
      at = runs["budget"] == c
      assert row["best_loss"][c] == pytest.approx(min(runs["L"][at & (runs["N"] == n)].mean()
                                                      for n in runs["N"][at]))
  assert "Lowest loss per budget" in text and text.count(f"{original['best_loss'][2e11]:.4f}")
  from experiments.scaling import plots
  minima = original["a2_minima"]
  assert [m["in_power_law"] for m in minima] == [True] * 4
  assert len(other["a2_minima"]) == 3  # its 2e11 curve has two sizes: no minimum
  assert os.path.getsize(plots.plot_ablation(str(tmp_path / "ablation.png"), table)) > 10_000
  # Grids that bracket the same budgets need no refit.
  same = ablation.ablation_table([first, first], bootstrap=0)
  assert same["common_a2_budgets"] is None and "a2_common" not in same["rows"][0]


def test_eval_noise_of_a_grid(tmp_path):
  from experiments.scaling import eval_noise  # pylint: disable=g-import-not-at-top
  def run(name, losses, finished=True):
    d = tmp_path / name
    d.mkdir()
    rows = [{"step": 10 * i, "loss": 9.0} for i in range(3)]
    rows += [{"step": 100 * (i + 1), "eval_loss": v} for i, v in enumerate(losses)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
      (d / "summary.json").write_text("{}")
  run("N=1,C=1", [3.0, 2.0, 1.0, 1.1])         # last half: |1.0 - 1.1|; final +0.1
  run("N=2,C=1", [3.0, 2.5, 2.0, 2.0, 1.5])    # last half: 0, 0.5; final -0.5
  run("N=3,C=1", [1.0, 9.0], finished=False)  # unfinished: left out
  n = eval_noise.grid_noise(str(tmp_path))
  assert n["runs"] == 2 and n["final_jumps_over_0.05"] == 2
  assert np.isclose(n["final_minus_previous_max_abs"], 0.5)
  assert np.isclose(n["final_minus_previous_median"], -0.2)
  assert np.isclose(n["swing_max"], 0.5) and np.isclose(n["swing_median"], 0.1)
  with pytest.raises(ValueError, match="no finished run"):
    eval_noise.grid_noise(str(tmp_path / "N=3,C=1"))
  with pytest.raises(SystemExit, match="python -m experiments.scaling.eval_noise"):
    eval_noise.main(["--help"])  # the usage, not "--help: no finished run"


def test_an_ablation_with_no_isoflop_minimum_still_draws_its_figure(tmp_path):
  from experiments.scaling import ablation, plots  # matplotlib
  rows = [dict(step=s, params="total", runs=6, a2=None, a2_ci95=None, a2_budgets=[],
               a2_minima=[], a3=0.5, a3_ci95=None, best_loss={2e9: 2.8}) for s in "ab"]
  table = {"budgets": [2e9], "common_a2_budgets": None, "rows": rows}
  assert "n/a" in ablation.markdown(table)  # log axes with nothing on them raised before
  assert os.path.exists(plots.plot_ablation(str(tmp_path / "ablation.png"), table))


def test_curves_count_compute_in_the_fits_convention(tmp_path):
  # The frontier L(C) is fitted on the curves, so their C must be the fits' C (total by
  # default), not the summary's non-embedding `flops`.
  workdir = str(tmp_path / "sweep")
  _fake_sweep(workdir, HOFFMANN)
  total, non = fit.load_runs(workdir, "total"), fit.load_runs(workdir, "non_embedding")
  assert total["curve_metric"] == "eval_loss"
  for i, (a, b) in enumerate(zip(total["curves"], non["curves"])):
    c_total, c_non = total["C_total"][i], total["C_non_embedding"][i]
    assert a[-1, 0] == c_total > c_non == b[-1, 0] and len(a) == 4
    np.testing.assert_allclose(a[:, 0] / b[:, 0], c_total / c_non)
  os.remove(os.path.join(workdir, fit.load_runs(workdir, "total")["name"][0], "metrics.jsonl"))
  assert fit.load_runs(workdir, "total")["curve_metric"] == "eval_loss"
  for name in fit.load_runs(workdir, "total")["name"][1:]:
    os.remove(os.path.join(workdir, name, "metrics.jsonl"))
  assert fit.load_runs(workdir, "total")["curve_metric"] == "final_eval_loss"
