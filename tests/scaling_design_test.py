"""The corrected scaling study of issue 18: shape rule, designs, lr law, E*, honest intervals.

Fast except the last test, which trains the CI-sized `corrected` design end to end (8 tiny
runs) and fits it.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments.scaling import fit, lr_law, shapes
from launch import sweep, sweep_values

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
scaling = pytest.importorskip("configs.scaling")
LAW = dict(E=0.8, A=60.0, B=300.0, alpha=0.45, beta=0.4)  # a = 0.4/0.85 = 0.4706


def _design(name, **sweep_overrides):
  config = scaling.get_config(f"design={name}")
  config.sweep.update(sweep_overrides)
  return config


def _model(config, run):
  return config.model.to_dict() | {k[6:]: v for k, v in run["overrides"].items()
                                   if k.startswith("model.")}


@pytest.mark.parametrize("ladder, vocab, head_dim", [
    (scaling.LADDER, 260, 32), (scaling.LADDER_FINE, 260, 32),
    (",".join(f"{5e6 * 10 ** (0.2 * k):.3g}" for k in range(12)) + ",1e9", 260, 64)])
def test_corrected_shape_rule_over_the_designs_range(ladder, vocab, head_dim):
  sizes = [float(x) for x in ladder.split(",")]
  # 10^0.2 apart up to the 3-significant-digit rounding of the ladder
  assert all(b / a <= 10 ** 0.2 * 1.005 for a, b in zip(sizes, sizes[1:]))
  for target in sizes:
    s = shapes.shape_for_size(target, min_layers=2, min_heads=2, small_head_dim=16,
                              count="total", vocab_size=vocab, head_dim=head_dim)
    n = shapes.param_counts(dict(s, vocab_size=vocab))["total"]
    assert abs(n / target - 1) <= 0.10, (target, n, s)
    assert s["num_layers"] >= 2 and s["num_heads"] >= 2
    assert s["head_dim"] == (16 if s["d_model"] < 64 else head_dim)
    assert s["d_model"] == s["num_heads"] * s["head_dim"]


def test_corrected_grid_meets_the_issue():
  config = _design("corrected", lr_law="0.05,-0.3")
  runs = sweep.expand(config)
  assert config.opt.b2 == 0.99
  budgets = sorted({r["budget"] for r in runs})
  assert len(budgets) >= 5 and budgets[-1] / budgets[0] >= 100
  for b in budgets:
    rs = [r for r in runs if r["budget"] == b]
    sizes = sorted({r["target_size"] for r in rs})
    centre = math.sqrt(b / (6 * 20))  # the first stage's prior, D/N = 20
    assert all(-0.9 - 1e-9 <= math.log10(n / centre) <= 0.5 + 1e-9 for n in sizes)
    assert len(sizes) >= (4 if b == budgets[0] else 5)  # 3e11: the 33k-parameter floor
    seeded = {n for n in sizes if sum(r["target_size"] == n for r in rs) == 3}
    nearest = lambda c: set(sorted(sizes, key=lambda n: abs(math.log(n / c)))[:3])
    measured = math.sqrt(b / (6 * 100))  # the second stage's centre, D/N = 100
    assert nearest(centre) | nearest(measured) == seeded
    # Two sizes left of the second stage's centre, where the shape rule's floor allows.
    assert len([n for n in sizes if n < measured]) >= min(2, len([
        n for n in sweep_values.numbers(config.sweep.sizes, "sizes") if n < measured]))
    assert len({r["batch_size"] for r in rs}) == 1
  for r in runs:
    o = r["overrides"]
    assert o["train.steps"] >= 500
    assert o["train.eval_batches"] * o["train.batch_size"] * 128 >= 100_000
    assert 1 <= o["opt.warmup_steps"] <= o["train.steps"] // 10
    assert o["opt.lr"] == pytest.approx(0.05 * r["params_total"] ** -0.3, rel=1e-3)
    model = _model(config, r)
    assert r["flops_total"] == shapes.flops_per_token(model, 128, "total") * r["tokens"]
    assert abs(r["flops_total"] / r["budget"] - 1) < 0.01  # budgets count total FLOPs
    assert r["flops_total"] - r["flops"] == 6 * 260 * model["d_model"] * r["tokens"]


def test_extended_grid_brackets_every_prior_with_two_sizes_each_side():
  config = _design("extended")  # reads the committed lr law
  assert config.data.size == "large" and config.opt.b2 == 0.99
  runs = sweep.expand(config)
  budgets = [float(b) for b in config.sweep.budgets.split(",")]
  assert len(budgets) >= 5 and budgets[-1] / budgets[0] >= 100
  assert [r["budget"] for r in runs] == sorted(r["budget"] for r in runs)  # budget by budget
  priors = [float(p) for p in config.sweep.tokens_per_param_priors.split(",")]
  for b, prior in zip(budgets, priors):
    rs = [r for r in runs if r["budget"] == b]
    sizes = sorted({r["target_size"] for r in rs})
    centre = math.sqrt(b / (6 * prior))
    assert len(sizes) == 6 and all(abs(math.log10(n / centre)) <= 0.5 for n in sizes)
    assert len([n for n in sizes if n < centre]) >= 2 <= len([n for n in sizes if n > centre])
    seeded = {n for n in sizes if sum(r["target_size"] == n for r in rs) == 3}
    assert seeded == set(sorted(sizes, key=lambda n: abs(math.log(n / centre)))[:3])
    for r in rs:
      o = r["overrides"]
      assert o["train.steps"] >= 500 and abs(r["flops_total"] / b - 1) < 0.01
      assert o["train.eval_batches"] * o["train.batch_size"] * 128 >= 100_000
  config.sweep.tokens_per_param_priors = "20,30"
  with pytest.raises(ValueError, match="give one per IsoFLOP budget"):
    sweep.expand(config)


def test_ffn_fallback_only_where_the_ratio_4_shape_misses_by_more_than_10_percent():
  rule = dict(min_layers=3, min_heads=2, small_head_dim=16, count="total", vocab_size=260)
  plain = shapes.shape_for_size(3.5e4, **rule)
  assert plain["d_ff"] == 4 * plain["d_model"]
  assert shapes.param_counts(dict(plain, vocab_size=260))["total"] / 3.5e4 > 1.1
  s = shapes.shape_for_size(3.5e4, ffn_fallback=(3, 2), **rule)
  n = shapes.param_counts(dict(s, vocab_size=260))["total"]
  assert s["num_layers"] >= 3 and abs(n / 3.5e4 - 1) <= 0.10 and s["d_ff"] == 2 * s["d_model"]
  # A target the ratio-4 rule meets keeps its shape; one no ratio meets keeps ratio 4's.
  assert shapes.shape_for_size(1.39e5, ffn_fallback=(3, 2), **rule) == \
      shapes.shape_for_size(1.39e5, **rule)
  assert shapes.shape_for_size(1e3, ffn_fallback=(3,), **rule) == \
      shapes.shape_for_size(1e3, **rule)


def test_extended_deep_changes_only_the_shapes_below_three_layers():
  extended = {r["name"]: r for r in sweep.expand(_design("extended"))}
  config = _design("extended_deep")
  deep = {r["name"]: r for r in sweep.expand(config)}
  assert set(deep) == set(extended)  # the same sizes, budgets and seeds
  changed = set()
  for name, r in deep.items():
    model, old = _model(config, r), _model(config, extended[name])
    assert model["num_layers"] >= 3 and model["num_heads"] >= 2
    assert abs(r["params_total"] / r["target_size"] - 1) <= 0.10
    assert abs(r["flops_total"] / r["budget"] - 1) < 0.01 and r["overrides"]["train.steps"] >= 500
    if old["num_layers"] < 3:
      changed.add(r["target_size"])
    else:
      assert r["overrides"] == extended[name]["overrides"]
  assert changed == {3.5e4, 6.98e4, 3.93e5}
  # Its ablation: the ablation_extended runs, with the deep grid's shapes.
  original = {r["name"]: r for r in sweep.expand(_design("ablation_extended"))}
  ablation = sweep.expand(_design("ablation_extended_deep"))
  assert {r["name"] for r in ablation} == set(original)
  shape_of = lambda run: {k: v for k, v in run["overrides"].items() if k.startswith("model.")}
  for r in ablation:
    assert shape_of(r) == shape_of(deep[r["name"]])
    assert (r["overrides"] == original[r["name"]]["overrides"]) == \
        (r["target_size"] not in changed)


def test_extended_deep_window_adds_only_the_window_sizes_the_cap_dropped():
  deep = {r["name"]: r for r in sweep.expand(_design("extended_deep"))}
  config = _design("extended_deep_window")
  window = {r["name"]: r for r in sweep.expand(config)}
  assert all(window[name]["overrides"] == r["overrides"] for name, r in deep.items())
  added = [window[name] for name in set(window) - set(deep)]
  assert {(r["target_size"], r["budget"], r["seed"]) for r in added} == \
      {(2.78e5, 3e12, 0), (4.94e4, 1e13, 0), (6.98e4, 3e13, 0),  # the window's sizes
       (9.86e4, 3e13, 1), (9.86e4, 3e13, 2), (1.97e5, 1e14, 1), (1.97e5, 1e14, 2)}  # seeds
  for r in added:
    assert r["overrides"]["train.steps"] >= 500 and _model(config, r)["num_layers"] >= 3
  # 3 seeds at the 3 sizes nearest each budget's measured minimum (sweep.seed_minima).
  minima = [float(n) for n in config.sweep.seed_minima.split(",")]
  for budget, best in zip([float(c) for c in config.sweep.budgets.split(",")], minima):
    runs = [r for r in window.values() if r["budget"] == budget]
    sizes = sorted({r["target_size"] for r in runs}, key=lambda n: abs(np.log(n / best)))
    for size in sizes[:3]:
      assert {r["seed"] for r in runs if r["target_size"] == size} == {0, 1, 2}, (budget, size)
  # Every budget now holds every ladder size within +-0.5 decade of its prior optimum.
  priors = [float(p) for p in config.sweep.tokens_per_param_priors.split(",")]
  ladder = [float(n) for n in config.sweep.sizes.split(",")]
  for budget, prior in zip([float(c) for c in config.sweep.budgets.split(",")], priors):
    n_opt = (budget / (6 * prior)) ** 0.5
    inside = {n for n in ladder if abs(np.log10(n / n_opt)) <= 0.5}
    assert inside == {r["target_size"] for r in window.values() if r["budget"] == budget}


def test_seed_minima_needs_one_size_per_budget():
  config = _design("extended_deep_window")
  config.sweep.seed_minima = "1e5,2e5"
  with pytest.raises(ValueError, match="give one measured minimum per IsoFLOP budget"):
    sweep.expand(config)


def test_ablation_steps_differ_only_in_their_settings():
  corrected = sweep.expand(_design("corrected", lr_law="0.05,-0.3"))
  old = _design("ablation")
  assert (old.opt.lr, old.opt.b2, old.opt.warmup_steps) == (3e-3, 0.95, 50)
  runs = sweep.expand(old)
  assert {(r["target_size"], r["budget"]) for r in runs} == \
      {(r["target_size"], r["budget"]) for r in corrected}
  for r in runs:
    assert "opt.lr" not in r["overrides"] and r["seed"] == 0
    assert r["overrides"]["opt.warmup_steps"] == min(50, r["overrides"]["train.steps"] // 10)
    assert abs(r["flops"] / r["budget"] - 1) < 0.01  # budgets count non-embedding FLOPs
  extended, old = sweep.expand(_design("extended")), _design("ablation_extended")
  assert old.data.size == "large" and (old.opt.lr, old.opt.b2) == (3e-3, 0.95)
  assert {(r["target_size"], r["budget"]) for r in sweep.expand(old)} == \
      {(r["target_size"], r["budget"]) for r in extended}
  warm = sweep.expand(_design("ablation_warmup"))
  assert any(r["overrides"]["opt.warmup_steps"] != 50 for r in warm)
  assert all(abs(r["flops_total"] / r["budget"] - 1) < 0.01
             for r in sweep.expand(_design("ablation_flops")))


def test_lr_sweep_design_and_law(tmp_path):
  runs = sweep.expand(_design("lr_sweep"))
  sizes = {r["target_size"] for r in runs}
  assert len(sizes) >= 3 and len({r["overrides"]["opt.lr"] for r in runs}) >= 4
  for r in runs:
    assert r["tokens"] / r["params_total"] == pytest.approx(20, rel=0.01)
  # A synthetic sweep whose best rate follows lr* = 0.05 N^-0.25 exactly.
  lrs = [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
  losses = {n: [(math.log10(lr) - math.log10(0.05 * n ** -0.25)) ** 2 + 2.0 for lr in lrs]
            for n in (3e4, 1e5, 3e5)}
  per = [dict(N=n, lrs=lrs, losses=y, **lr_law.best_lr(lrs, y)) for n, y in losses.items()]
  law = lr_law.fit_lr_law([3e4, 1e5, 3e5], per)
  assert law["exponent"] == pytest.approx(-0.25, abs=1e-6)
  lo, hi = law["exponent_tol_range"]
  assert lo < -0.25 < hi and hi - lo > 0.01
  assert "exponent_ci95" not in law  # no interval without the loss noise
  # An sd measured on few degrees of freedom leaves sigma uncertain, so the interval widens
  # (t tails), never narrows, against one drawn with sigma as good as known.
  width = {dof: np.diff(lr_law.fit_lr_law([3e4, 1e5, 3e5], per, noise_sd=0.02, noise_dof=dof,
                                          bootstrap=1000)["exponent_ci95"])[0]
           for dof in (3, 100_000)}
  assert width[3] > 1.5 * width[100_000]
  path = tmp_path / "lr_law.json"
  path.write_text(json.dumps(dict(law, convention="total")))
  got = sweep.expand(_design("corrected", lr_law=str(path)))
  assert got[0]["overrides"]["opt.lr"] == pytest.approx(
      law["coef"] * got[0]["params_total"] ** law["exponent"], rel=1e-3)
  with pytest.raises(ValueError, match="run the learning-rate sweep"):
    sweep.expand(_design("corrected", lr_law=str(tmp_path / "missing.json")))
  path.write_text(json.dumps(dict(law, convention="non_embedding")))
  with pytest.raises(ValueError, match="fitted on non_embedding"):
    sweep.expand(_design("corrected", lr_law=str(path)))


def test_the_lr_laws_noise_comes_from_a_grids_fit(tmp_path):
  # The published law's interval used the main grid's measured seed noise: run_all.sh's
  # --noise_from reads the same numbers from that grid's fit.json.
  results = pathlib.Path(ROOT) / "experiments/scaling/results/grammar_corpus"
  published = json.loads((results / "lr_sweep_lr_law.json").read_text())
  sd, dof = lr_law.noise_from(str(results / "fit.json"))
  assert (sd, dof) == (published["noise_sd"], published["noise_dof"])
  per = published["per_size"]  # and they give the published interval again
  again = lr_law.fit_lr_law([p["N"] for p in per], per, tol=published["tol"], noise_sd=sd,
                            noise_dof=dof)
  np.testing.assert_allclose(again["exponent_ci95"], published["exponent_ci95"], rtol=1e-9)
  with pytest.raises(ValueError, match="has no repeated seeds, so it measured no seed noise"):
    lr_law.noise_from(str(results / "ablation_extended_fit.json"))
  (tmp_path / "fit.json").write_text("{}")
  with pytest.raises(ValueError, match=r"not a scaling fit's fit.json .*KeyError"):
    lr_law.noise_from(str(tmp_path / "fit.json"))


def test_stdlib_prunes_budgets_that_repeat_the_data():
  config = _design("stdlib", lr_law="0.05,-0.3")
  assert config.data.name == "python_stdlib" and config.data.shuffle_window > 0
  for r in sweep.expand(config):
    assert r["tokens"] <= 4 * scaling.STDLIB_TOKENS
  config.sweep.dataset_tokens = 1e6  # a corpus this small feeds only the smallest budgets
  pruned = sweep.pruned_budgets(config)
  assert pruned and all(r["tokens"] <= 4e6 for r in sweep.expand(config))
  assert set(pruned).isdisjoint({r["budget"] for r in sweep.expand(config)})


def test_every_new_design_and_its_tiny_variant_expand():
  for name in ("lr_sweep", "corrected", "ablation", "ablation_flops", "ablation_warmup",
               "stdlib", "gpu", "extended", "ablation_extended"):
    tiny = scaling.get_config(f"design={name},tiny=true")
    assert sweep.expand(tiny), name
    full = scaling.get_config(f"design={name}")
    if full.sweep.lr_law.endswith(".json"):
      full.sweep.lr_law = "0.05,-0.3"
    assert sweep.expand(full), name


def test_gpu_design_runs_through_slurm_unchanged(tmp_path):
  config = _design("gpu", lr_law="0.05,-0.3")
  ladder = [float(x) for x in config.sweep.sizes.split(",")]
  assert min(ladder) == 5e6 and max(ladder) == 1e9
  runs = sweep.expand(config)
  budgets = sorted({r["budget"] for r in runs})
  assert budgets[0] == 1e17 and budgets[-1] == 1e19
  sizes = [r["params_total"] for r in runs]
  assert min(sizes) < 1.5e7 and max(sizes) > 5e8 and min(r["overrides"]["train.steps"]
                                                     for r in runs) >= 500
  cmd = [sys.executable, "-m", "launch.slurm", "--config",
         "configs/scaling.py:design=gpu", "--workdir", str(tmp_path),
         "--config.sweep.lr_law=0.05,-0.3", "--gpus_per_node=8"]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = (tmp_path / "slurm_array.sh").read_text()
  assert f"#SBATCH --array=0-{len(runs) - 1}" in text
  proc = subprocess.run(["bash", "launch/tpu_vm.sh", "t", "z", "--config",
                         "configs/scaling.py:design=gpu", "--workdir", "/mnt/s"],
                        capture_output=True, text=True, cwd=ROOT,
                        env=dict(os.environ, DRY_RUN="1"), timeout=120)
  assert proc.returncode == 0 and "design=gpu" in proc.stdout


def _isoflop_runs(law, seed, noise=0.004):
  """IsoFLOP curves of `law` (C = 6ND), 6 sizes 10^0.2 apart around each optimum, 3 seeds at
  the middle 3 sizes."""
  rng = np.random.default_rng(seed)
  budget, n, d, loss = [], [], [], []
  for c in np.geomspace(1e12, 1e14, 5):
    centre = fit.compute_optimal(law, c)["N_opt"]
    for k, size in enumerate(centre * 10 ** (0.2 * (np.arange(6) - 2.5))):
      for _ in range(3 if 1 <= k <= 3 else 1):
        budget.append(c)
        n.append(size)
        d.append(c / (6 * size))
        loss.append(fit.predict_loss(law, size, c / (6 * size)) * np.exp(rng.normal(0, noise)))
  return [np.array(v) for v in (budget, n, d, loss)]


def test_local_approach_2_intervals_cover_the_truth():
  truth = fit._with_exponents(LAW)
  covered = 0
  for seed in range(4):
    budget, n, d, loss = _isoflop_runs(LAW, seed)
    got = fit.fit_isoflop_local(budget, n, loss, d, budget, bootstrap=100, seed=seed)
    lo, hi = got["ci"]["a"]
    assert hi - lo > 0.005  # never zero-width
    covered += lo <= truth["a"] <= hi
    assert got["a"] == pytest.approx(truth["a"], abs=0.08)
    assert got["seed_noise"]["groups"] == 15
    assert got["seed_noise"]["sigma"] == pytest.approx(0.004 * loss.mean(), rel=0.4)
    assert all(k["bracketed"] for k in got["curves"])
  assert covered >= 3


@pytest.mark.slow
def test_approach_3_free_and_fixed_E_intervals_cover_the_truth():
  budget, n, d, loss = _isoflop_runs(LAW, seed=7, noise=0.002)
  truth = fit._with_exponents(LAW)
  free = fit.fit_chinchilla(n, d, loss, grid="coarse", bootstrap=30)
  fixed = fit.fit_chinchilla(n, d, loss, grid="coarse", bootstrap=30, E=LAW["E"])
  for got in (free, fixed):
    lo, hi = got["ci"]["a"]
    assert hi - lo > 1e-3 and lo <= truth["a"] <= hi
  assert fixed["E"] == pytest.approx(LAW["E"], rel=1e-12) and fixed["E_fixed"]
  # IsoFLOP-only designs pin E loosely; one 95% interval from one noise draw may just miss
  # the truth, so this asks for a non-zero width and agreement within 5% (the issue's goal
  # is E within 10% of E*).
  lo, hi = free["ci"]["E"]
  assert hi - lo > 1e-3 and lo <= 1.05 * LAW["E"] and hi >= 0.95 * LAW["E"]
  table = fit.a_against_fixed_E(n, d, loss, [0.4, 0.6, 0.8])
  assert [round(r["E"], 3) for r in table] == [0.4, 0.6, 0.8]
  assert table[-1]["a"] == pytest.approx(truth["a"], abs=0.03)
  with pytest.raises(ValueError, match="must lie in"):
    fit.fit_chinchilla(n, d, loss, E=10.0)


def test_loss_floor_must_agree():
  runs = dict(loss_floor=[0.7, 0.7], doc_sentences=["1,1", "1,1"])
  assert fit.loss_floor(runs) == dict(E_star=0.7, source="summary.json loss_floor",
                                      doc_sentences="1,1")
  assert fit.loss_floor(runs, 0.6)["E_star"] == 0.6
  with pytest.raises(ValueError, match="disagree on loss_floor"):
    fit.loss_floor(dict(loss_floor=[0.7, 0.8], doc_sentences=[None, None]))
  with pytest.raises(ValueError, match="have no loss_floor"):
    fit.loss_floor(dict(loss_floor=[0.7, None], doc_sentences=[None, None]))
  assert fit.loss_floor(dict(loss_floor=[None], doc_sentences=[None]))["E_star"] is None


@pytest.mark.slow
def test_tiny_corrected_design_trains_and_fits_end_to_end(tmp_path):
  workdir = str(tmp_path / "sweep")
  cmd = [sys.executable, "-m", "launch.local",
         "--config=configs/scaling.py:design=corrected,tiny=true", f"--workdir={workdir}",
         "--parallel=2"]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  runs = json.load(open(os.path.join(workdir, "sweep.json")))["runs"]
  for r in runs:
    summary = json.load(open(os.path.join(workdir, r["name"], "summary.json")))
    for key in ("params_total", "flops", "flops_total", "flops_per_token_total"):
      assert summary[key] == r[key], key
    assert summary["config"]["opt.b2"] == 0.99
    # E* arrives in summary.json from the data side; stand in for it here.
    summary["loss_floor"] = 0.5
    json.dump(summary, open(os.path.join(workdir, r["name"], "summary.json"), "w"))
  again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert f"{len(runs)} finished, 0 to run" in again.stdout  # resumable: nothing re-runs
  proc = subprocess.run([sys.executable, "-m", "experiments.scaling.fit", f"--workdir={workdir}",
                         "--grid=coarse", "--bootstrap=4", "--local_points=3"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.load(open(os.path.join(workdir, "fit.json")))
  for key in ("E", "A", "B", "alpha", "beta", "a", "b", "E_star", "a_ci95", "b_ci95",
              "a_approach2", "a_approach2_ci95", "conventions"):
    assert key in result, key
  assert result["E_star"] == 0.5 and result["conventions"]["params"] == "total"
  assert result["conventions"]["other"]["params"] == "non_embedding"


@pytest.mark.parametrize("key,value", [("norm", "layernorm"), ("use_bias", True),
                                       ("norm_position", "post"), ("position", "learned"),
                                       ("position", "t5_bias")])
def test_a_model_the_closed_form_cannot_count_is_refused(key, value):
  """The grid's parameter count (and so its FLOPs and step counts) is a closed form for
  pre-norm RMSNorm decoders without biases or position tables; another model is refused by
  name instead of recorded with a count its trainer would contradict."""
  from transformer import schema
  model = schema.model_config(d_model=64, num_layers=2, num_heads=2, d_ff=256)
  assert shapes.param_counts(model)["total"] > 0
  if key == "position":
    model.position = schema.position_config(value)
  else:
    model[key] = value
  with pytest.raises(ValueError, match=rf"\{{'{key}(.name)?': '?{value}'?\}} is outside that"):
    shapes.param_counts(model)


def test_lr_law_interval_covers_the_true_exponent():
  """The exponent's 95% interval from a parametric bootstrap (the seed noise given, as on the
  published grid: sd 0.0127 with 42 degrees of freedom) covers the true exponent of synthetic
  sweeps on the published grid of rates, sizes and curvatures. The tolerance range it
  replaced never saw the noise and covered 0.85 of 200 such sweeps (the interval 0.985)."""
  rng = np.random.default_rng(1)
  sizes, lrs, sd, true = [3.3e4, 1.39e5, 3.5e5], [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], 0.0127, -0.1
  hits, reps = 0, 60
  for r in range(reps):
    per = []
    for n, curvature in zip(sizes, (0.336, 0.0759, 0.155)):  # the published parabolas
      opt = math.log10(0.007 * (n / 1e5) ** true)
      losses = [curvature * (math.log10(lr) - opt) ** 2 + 1.0 + rng.normal(0, sd) for lr in lrs]
      per.append(dict(N=n, lrs=lrs, losses=losses, **lr_law.best_lr(lrs, losses)))
    law = lr_law.fit_lr_law(sizes, per, noise_sd=sd, noise_dof=42, bootstrap=200, seed=r)
    lo, hi = law["exponent_ci95"]
    hits += lo <= true <= hi
  assert hits / reps >= 0.88, hits / reps
  with pytest.raises(ValueError, match="--noise_sd needs --noise_dof"):
    lr_law.fit_lr_law(sizes, per, noise_sd=sd)
