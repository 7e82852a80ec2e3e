"""The retrieval models' criterion loop (experiments/probes/criterion.py), end to end from the
command line at CI size: stages extend a run, a run below the criterion at the cap is
retried with other settings, checks are cached so a re-run trains nothing it has, and a run
resumed with more steps is the run given those steps from the start. The LM-then-retrieval
path is checked in tests/experiments_test.py::test_probes_outputs."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from configs import probes as probes_config
from experiments.probes import criterion

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = "configs/probes.py:tiny=true,steps=4"
# One LM scheme, one retrieval scheme, no LM-pretrained runs: the criterion loop alone.
ONLY_ROPE = ("--config.experiment.schemes=rope", "--config.experiment.kv_schemes=rope",
             "--config.experiment.kv_pretrained_schemes=")


def _command(module, config, workdir, *extra):
  env = dict(os.environ, TFDS_DATA_DIR=str(workdir.parent / "tfds"))
  proc = subprocess.run([sys.executable, "-m", module, "--config", config, "--workdir",
                         str(workdir), *extra], cwd=ROOT, env=env, capture_output=True,
                        text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def _probes(lm, workdir, *extra):
  out = _command("experiments.probes.run", TINY, workdir, f"--config.experiment.lm_workdir={lm}",
                 *ONLY_ROPE, *extra)
  return out, json.loads((workdir / "results.json").read_text())


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("probes") / "lm"
  _command("experiments.extrapolation.run", "configs/extrapolation.py:tiny=true,steps=4",
           workdir, "--config.experiment.schemes=rope")
  return workdir


def _summary(run_dir):
  return json.loads((run_dir / "summary.json").read_text())


def test_stages_and_attempts_from_the_config():
  config = probes_config.get_config()
  exp = config.experiment
  assert criterion.stages(exp) == [exp.kv_steps, *range(exp.kv_steps + exp.kv_extend_steps,
                                                        exp.kv_max_steps, exp.kv_extend_steps),
                                   exp.kv_max_steps]
  assert exp.kv_check_items >= 500 and exp.kv_criterion == 0.9
  exp.kv_steps, exp.kv_extend_steps, exp.kv_max_steps = 2, 3, 7
  assert criterion.stages(exp) == [2, 5, 7]  # the cap is always the last check
  exp.kv_max_steps = 1
  with pytest.raises(ValueError, match="kv_steps <= kv_max_steps"):
    criterion.stages(exp)
  exp.kv_max_steps = 7
  config.experiment.kv_retry.rope = "opt.lr=3e-4 | opt.lr=1e-2;opt.warmup_steps=5"
  assert criterion.attempts(config, "rope") == ["", "opt.lr=3e-4", "opt.lr=1e-2;opt.warmup_steps=5"]
  config.experiment.kv_retry.rope = "opt.lr"
  with pytest.raises(ValueError, match="experiment.kv_retry.rope"):
    criterion.attempts(config, "rope")
  # A retry entry's kv_max_steps is that attempt's cap, never a config override.
  assert criterion.split_retry("opt.lr=3e-4;kv_max_steps=9") == ("opt.lr=3e-4", 9, None)
  assert criterion.split_retry("opt.lr=3e-4") == ("opt.lr=3e-4", None, None)
  # ... and its kv_warm_pairs its warm-up runs, one per count, in order.
  assert criterion.split_retry("kv_warm_pairs=4,8;opt.lr=3e-4") == ("opt.lr=3e-4", None, (4, 8))
  exp.kv_warm_steps, exp.kv_warm_pairs, exp.kv_train_pairs = 5, 2, 8
  assert criterion.warm_pairs(exp) == (2,)
  assert criterion.warm_pairs(exp, "opt.lr=1e-2;kv_warm_pairs=2,4,8") == (2, 4, 8)
  for bad in ("kv_warm_pairs=4,x", "kv_warm_pairs=0", "kv_max_steps=3,4"):
    with pytest.raises(ValueError, match="kv_retry entry"):
      criterion.split_retry(bad)
  config.experiment.kv_retry.rope = "kv_warm_pairs=4,16"  # past kv_train_pairs=8
  with pytest.raises(ValueError, match="each at most kv_train_pairs=8"):
    criterion.attempts(config, "rope")
  exp.kv_warm_steps = 0
  assert criterion.warm_pairs(exp, "kv_warm_pairs=2,4") == ()
  assert criterion.stages(exp, 9) == [2, 5, 8, 9] and criterion.stages(exp) == [2, 5, 7]
  config.experiment.kv_retry.rope = "opt.lr=3e-4;kv_max_steps=9"
  cfg = criterion.attempt_config(config, "rope", 0, criterion.attempts(config, "rope")[1], 9)
  assert cfg.opt.lr == 3e-4 and "kv_max_steps" not in cfg.to_json()
  for bad in ("kv_max_steps=x", "kv_max_steps=1"):  # not a number; below kv_steps
    config.experiment.kv_retry.rope = bad
    with pytest.raises(ValueError, match="kv_max_steps"):
      criterion.attempts(config, "rope")


def test_the_lm_pretrained_variant_can_have_its_own_attempts():
  config = probes_config.get_config()
  exp = config.experiment
  exp.kv_retry.none = "opt.lr=3e-4 | kv_warm_pairs=2,4"
  # Unset: the variant tries what the from-scratch runs try.
  assert exp.kv_pretrained_retry.none is None
  assert criterion.attempts(config, "none", pretrained=True) == criterion.attempts(config, "none")
  exp.kv_pretrained_retry.none = "opt.lr=3e-4"
  assert criterion.attempts(config, "none", pretrained=True) == ["", "opt.lr=3e-4"]
  assert criterion.attempts(config, "none") == ["", "opt.lr=3e-4", "kv_warm_pairs=2,4"]
  exp.kv_pretrained_retry.none = ""  # no retry at all
  assert criterion.attempts(config, "none", pretrained=True) == [""]
  exp.kv_pretrained_retry.none = "opt.lr"  # a typo names the table it is in
  with pytest.raises(ValueError, match="experiment.kv_pretrained_retry.none"):
    criterion.attempts(config, "none", pretrained=True)
  # A placeholder of type str: any scheme takes a string
  # (as --config.experiment.kv_pretrained_retry.rope=...).
  exp.kv_pretrained_retry.rope = "opt.lr=1e-3"
  assert criterion.attempts(config, "rope", pretrained=True) == ["", "opt.lr=1e-3"]


@pytest.mark.parametrize("outcomes, chosen, trained", [
    # (met by attempt index, per seed) -> the attempt each seed reports, what was trained
    ({0: [1, 1, 1]}, 0, {0: [0], 1: [0], 2: [0]}),
    ({0: [0], 1: [1, 1, 1]}, 1, {0: [0, 1], 1: [1], 2: [1]}),
    # A setting one seed in three meets is not the scheme's: the next entry, all seeds again.
    ({0: [0], 1: [1, 0, 0], 2: [1, 1, 1]}, 2, {0: [0, 1, 2], 1: [1, 2], 2: [1, 2]}),
    # ... and when nothing does better, the seeds report the entry most of them met.
    ({0: [0], 1: [1, 0, 1], 2: [1, 0, 0]}, 1, {0: [0, 1, 2], 1: [1, 2], 2: [1, 2]}),
    ({0: [0], 1: [0], 2: [0]}, None, {0: [0, 1, 2], 1: [], 2: []}),
])
def test_a_setting_is_the_schemes_when_every_seed_meets_it(monkeypatch, outcomes, chosen,
                                                           trained):
  config = probes_config.get_config("tiny=true")
  entries = [f"opt.lr={lr}" for lr in (1e-3, 1e-2)][:len(outcomes) - 1]
  config.experiment.kv_retry.rope = " | ".join(entries)
  calls = []

  def attempt(config, workdir, scheme, seed, index, retry, variant, label):
    calls.append((seed, index))
    met = bool(outcomes[index][seed])
    return {"retry": index, "settings": retry, "run_dir": f"{seed}/{index}", "warm": None,
            "checks": [{"step": 7, "accuracy": float(met)}], "met": met, "step": 7,
            "wall_time_s": 1.0}

  monkeypatch.setattr(criterion, "_train_attempt", attempt)
  out = criterion.train_to_criterion(config, "unused", "rope", [0, 1, 2])
  assert {s: [i for t, i in calls if t == s] for s in (0, 1, 2)} == trained
  for seed, record in out.items():
    assert [a["retry"] for a in record["attempts"]] == trained[seed]
    if chosen is None:
      assert record["met"] is False and ("why" in record) == (seed > 0)
    else:
      assert record["run_dir"] == f"{seed}/{chosen}"
      assert record["met"] == bool(outcomes[chosen][seed])


def test_check_items_are_held_out_and_uniform_in_position():
  items = criterion.check_items(32, 512)
  assert len(set(items)) == 512
  train_like = criterion.check_items(32, 512, seed=1)
  assert not set(items) & set(train_like)
  # The queried key's index among the pairs covers the whole context.
  positions = []
  for q, _ in items:
    pairs, key = q.split(" ? ")
    positions.append([p.split(":")[0] for p in pairs.split(" ")].index(key))
  assert min(positions) == 0 and max(positions) == 31


def _staged(lm, workdir, cap, criterion_, retry):
  """Stages of 2 steps up to `cap`, the criterion, and RoPE's retry entry."""
  return _probes(lm, workdir, "--config.experiment.kv_steps=2",
                 "--config.experiment.kv_extend_steps=2",
                 f"--config.experiment.kv_max_steps={cap}",
                 f"--config.experiment.kv_criterion={criterion_}",
                 f"--config.experiment.kv_retry.rope={retry}")


@pytest.mark.slow
def test_criterion_loop_extends_retries_caches_and_resumes(lm, tmp_path):
  workdir = tmp_path / "probes"
  kv = workdir / "kv" / "runs" / "rope"
  # Not reachable in 4 steps: two stages (2, 4), then the retry's two stages.
  out, results = _staged(lm, workdir, 4, 0.99, "opt.lr=1e-2")
  record = results["retrieval_criterion"]["rope"]["0"]
  assert record["met"] is False and record["steps_to_criterion"] is None
  assert [a["retry"] for a in record["attempts"]] == [0, 1]
  assert [[c["step"] for c in a["checks"]] for a in record["attempts"]] == [[2, 4], [2, 4]]
  assert all(c["n"] == 8 and 0 <= c["accuracy"] < 0.99 for a in record["attempts"]
             for c in a["checks"])
  assert record["run_dir"].endswith("seed0_retry1") and record["settings"] == "opt.lr=1e-2"
  assert _summary(kv / "seed0")["step"] == 4 and _summary(kv / "seed0_retry1")["step"] == 4
  retry_config = json.loads((kv / "seed0_retry1" / "config.json").read_text())
  assert retry_config["opt"]["lr"] == 1e-2 and retry_config["opt"]["schedule"] == "rsqrt"
  # Each attempt starts from its own warm-up (2 steps on 2 pairs, with its own settings).
  for attempt, lr in (("seed0", 1e-3), ("seed0_retry1", 1e-2)):
    warm_config = json.loads((kv / f"{attempt}_warm" / "config.json").read_text())
    assert warm_config["opt"]["lr"] == lr and warm_config["data"]["num_pairs"] == 2
    assert _summary(kv / f"{attempt}_warm")["step"] == 2
    config = json.loads((kv / attempt / "config.json").read_text())
    assert config["train"]["init_from"] == str(kv / f"{attempt}_warm")
  assert [a["warm"]["steps"] for a in record["attempts"]] == [2, 2]
  assert "warm-up of 2 steps on items of 2 pairs" in (workdir / "results.md").read_text()
  assert results["retrieval_compared"][""] == []
  assert "rope" in results["retrieval"]  # evaluated and shown, marked as a failure
  md = (workdir / "results.md").read_text()
  assert "no (training failure)" in md and "| rope | 0 | False | — | opt.lr=1e-2 |" in md

  # The retry's own higher cap (tuning its steps): only the retry trains on, from step 4.
  out, results = _staged(lm, workdir, 4, 0.99, "opt.lr=1e-2;kv_max_steps=6")
  record = results["retrieval_criterion"]["rope"]["0"]
  assert out.count("== training") == 1 and "(retry 1: opt.lr=1e-2;kv_max_steps=6) to step 6" in out
  assert [[c["step"] for c in a["checks"]] for a in record["attempts"]] == [[2, 4], [2, 4, 6]]
  assert _summary(kv / "seed0")["step"] == 4 and _summary(kv / "seed0_retry1")["step"] == 6
  assert record["settings"] == "opt.lr=1e-2;kv_max_steps=6"

  # A criterion the first stage meets: its cached check decides, nothing trains again, and
  # the evaluated model is that stage's checkpoint.
  out, results = _staged(lm, workdir, 4, 0.0, "opt.lr=1e-2")
  record = results["retrieval_criterion"]["rope"]["0"]
  assert "== training" not in out and "== warm-up" not in out
  assert record["met"] is True and record["steps_to_criterion"] == 2 and record["step"] == 2
  assert record["run_dir"].endswith("seed0") and len(record["attempts"]) == 1
  assert results["retrieval_compared"][""] == ["rope"]

  # A higher cap resumes the first attempt from step 4 (stages 2 and 4 come from the cache).
  out, results = _staged(lm, workdir, 6, 0.99, "")
  record = results["retrieval_criterion"]["rope"]["0"]
  assert out.count("== training") == 1 and "to step 6" in out
  assert [c["step"] for c in record["attempts"][0]["checks"]] == [2, 4, 6]
  staged = _summary(kv / "seed0")
  assert staged["step"] == 6

  # The rsqrt schedule ignores train.steps: 2 + 2 + 2 steps in three sessions are 6 steps
  # in one.
  fresh = tmp_path / "fresh"
  _probes(lm, fresh, "--config.experiment.kv_steps=6", "--config.experiment.kv_max_steps=6",
          "--config.experiment.kv_criterion=0.99", "--config.experiment.kv_retry.rope=")
  once = _summary(fresh / "kv" / "runs" / "rope" / "seed0")
  assert once["final_eval_loss"] == pytest.approx(staged["final_eval_loss"], rel=1e-5)


@pytest.mark.slow
def test_a_retry_entry_can_warm_up_in_stages(lm, tmp_path):
  workdir = tmp_path / "probes"
  kv = workdir / "kv" / "runs" / "rope"
  out, results = _staged(lm, workdir, 2, 0.99, "opt.lr=1e-2;kv_warm_pairs=1,2")
  # The scheme's own attempt warms up once (2 pairs), its retry on 1 then 2 pairs.
  assert out.count("== warm-up") == 3 and "2 steps on 1 pairs in" in out
  first, second, retry = (json.loads((kv / name / "config.json").read_text()) for name in
                          ("seed0_retry1_warm", "seed0_retry1_warm2", "seed0_retry1"))
  assert first["data"]["num_pairs"] == 1 and second["data"]["num_pairs"] == 2
  assert first["train"]["init_from"] == "" and first["opt"]["lr"] == 1e-2
  assert second["train"]["init_from"] == str(kv / "seed0_retry1_warm")
  assert retry["train"]["init_from"] == str(kv / "seed0_retry1_warm2")
  own, staged = results["retrieval_criterion"]["rope"]["0"]["attempts"]
  assert own["warm"]["pairs"] == 2 and own["warm"]["steps"] == 2
  assert staged["warm"]["pairs"] == [1, 2] and staged["warm"]["steps"] == 4
  assert staged["warm"]["run_dir"] == str(kv / "seed0_retry1_warm2")


@pytest.mark.slow
def test_changed_retrieval_settings_are_refused_before_training(lm, tmp_path):
  workdir = tmp_path / "probes"
  _probes(lm, workdir, "--config.experiment.kv_criterion=0.0")
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.probes.run", "--config", TINY, "--workdir",
       str(workdir), f"--config.experiment.lm_workdir={lm}", *ONLY_ROPE,
       "--config.experiment.kv_lr=0.5"], cwd=ROOT, capture_output=True, text=True,
      env=dict(os.environ, TFDS_DATA_DIR=str(tmp_path / "tfds")))
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "opt.lr" in lines[0] and "new --workdir" in lines[0], proc.stderr


def test_agreement_tables_pool_fresh_and_cached_seeds_alike():
  """A seed probed in this process keys its cells by int, one read back from its JSON cache by
  str; the pooled table and the summary must count both (a re-run once printed every cell
  as 'n/a (too long)')."""
  from experiments.probes import plots, run  # noqa: PLC0415
  cell = lambda acc: {"accuracy": acc, "n": 500, "wilson95": run.wilson(round(acc * 500), 500)}
  fresh = {"by_attractors": {k: cell(0.9 - 0.1 * k) for k in range(5)},
           "by_verb_kind": {"copula": cell(0.8)}}
  cached = json.loads(json.dumps({"by_attractors": {k: cell(0.7 - 0.1 * k) for k in range(5)},
                                  "by_verb_kind": {"copula": cell(0.6)}}))
  by_seed = {"0": fresh, "1": cached}
  pooled = run.pool_seeds(by_seed)
  assert sorted(pooled) == ["0", "1", "2", "3", "4"]
  assert pooled["0"]["seeds"] == 2 and abs(pooled["0"]["mean"] - 0.8) < 1e-9
  assert pooled == json.loads(json.dumps(pooled))  # the same table before and after saving
  assert plots._pooled_by(by_seed, "by_attractors")["0"][0] == pytest.approx(0.8)
  text = plots.summary({"agreement": {"rope": by_seed}, "agreement_pooled": {"rope": pooled},
                        "kv_train_pairs": 32})
  assert "too long" not in text and "| rope | 0.800 ± 0.141" in text
  one = {"0": fresh}
  text = plots.summary({"agreement": {"rope": one}, "agreement_pooled": {"rope": run.pool_seeds(one)},
                        "kv_train_pairs": 32})
  assert "| rope | 0.900 (one seed) [" in text and "± 0.000" not in text


def test_census_table_gives_each_seeds_strongest_head_and_the_spread_over_seeds():
  """Each seed's strongest head by its own argmax (the head may differ by seed), the mean and
  sample sd of those scores, and every seed's notable heads counted."""
  from experiments.probes import plots  # noqa: PLC0415
  def seed(scores, notable):
    return {"census": {"nearest_attractor": scores}, "census_items": {},
            "notable_heads": [{"layer": li, "head": h, "kind": "previous-token head",
                               "score": 0.9} for li, h in notable]}
  census = {"rope": {"0": seed([[0.1, 0.2], [0.6, 0.3]], [(0, 1)]),
                     "1": seed([[0.1, 0.4], [0.2, 0.3]], [(0, 0), (1, 1)]),
                     "2": seed([[0.5, 0.0], [0.0, 0.0]], [])}}
  text = "\n".join(plots._census_lines(census))
  values = np.array([0.6, 0.4, 0.5])
  assert (f"| rope | nearest_attractor (strongest) | 0: 1.0 0.600; 1: 0.1 0.400; 2: 0.0 0.500 | "
          f"{values.mean():.3f} ± {values.std(ddof=1):.3f} |") in text
  assert "seeds 0, 1, 2 of each scheme" in text
  assert "| heads per seed: 1, 2, 0 |" in text
  one = "\n".join(plots._census_lines({"rope": {"0": census["rope"]["0"]}}))
  assert "| 0.600 (one seed) |" in one


def test_retrieval_plot_keeps_each_models_colour_in_every_panel(tmp_path, monkeypatch):
  """A model with no row at some length (learned beyond its position table) must not shift
  the others' colours there, and the legend names every model (it once came from the last
  panel only, so RoPE's curve wore ALiBi's label in the other panels)."""
  import matplotlib.pyplot as plt  # noqa: PLC0415
  from experiments.probes import plots, run  # noqa: PLC0415
  row = lambda acc: {"accuracy_by_position": {
      str(p): {"accuracy": acc, "n": 100, "wilson95": run.wilson(round(acc * 100), 100)}
      for p in range(3)}}
  stale = row(1.0)  # cached before Wilson's bounds were clamped: a negative error bar
  stale["accuracy_by_position"]["0"]["wilson95"] = [0.96, 1.0 - 1e-12]
  results = {"kv_train_pairs": 8, "kv_min_pairs": 2, "retrieval": {
      "learned": {"0": {"8": row(0.1), "16": {"not_applicable": "beyond max_len"}}},
      "rope": {"0": {"8": row(0.5), "16": stale}},
      "alibi": {"0": {"8": row(0.9), "16": row(0.8)}}},
      "retrieval_criterion": {s: {"0": {"met": s != "learned"}} for s in ("learned", "rope",
                                                                          "alibi")}}
  figures = []
  monkeypatch.setattr(plt, "close", figures.append)
  plots.retrieval(results, str(tmp_path / "retrieval.png"))
  axes = figures[0].axes
  colour = lambda ax, label: next(c.lines[0].get_color() for c in ax.containers
                                  if c.get_label() == label)
  for label in ("rope", "alibi"):
    assert colour(axes[0], label) == colour(axes[1], label), label
  assert colour(axes[0], "rope") != colour(axes[0], "alibi")
  legend = [t.get_text() for t in axes[-1].get_legend().get_texts()]
  assert legend == ["learned [training failure]", "rope", "alibi"]


def test_distance_control_is_exact_for_the_probe_design():
  """distance_control derives (distance, attractors) cells from the recorded marginals; that is
  exact only because distance 0 holds just the 0-attractor items and distance 3 just 0- and
  1-attractor ones. Check the design, then the derivation against the items' own counts."""
  import random  # noqa: PLC0415

  from experiments.probes import run  # noqa: PLC0415
  from transformer.data import grammar  # noqa: PLC0415
  items = [it for k in range(5) for it in grammar.agreement_probes(200, k, seed=3)]
  assert {it.num_attractors for it in items if it.distance == 0} == {0}
  assert {it.num_attractors for it in items if it.distance == 3} == {0, 1}
  rng = random.Random(0)
  rights = [[rng.random() < (p0 if it.num_attractors == 0 else p1) for it in items]
            for p0, p1 in ((0.9, 0.4), (0.8, 0.6))]
  prop = lambda rs: {"accuracy": sum(rs) / len(rs), "n": len(rs)}
  record = lambda right: {
      "by_attractors": {k: prop([r for it, r in zip(items, right) if it.num_attractors == k])
                        for k in range(5)},
      "by_distance": {d: prop([r for it, r in zip(items, right) if it.distance == d])
                      for d in {it.distance for it in items}}}
  # One seed fresh (int keys), one read back from JSON (str keys).
  control = run.distance_control({"0": record(rights[0]),
                                  "1": json.loads(json.dumps(record(rights[1])))})
  for key, k, d in (("d0_k0", 0, 0), ("d3_k0", 0, 3), ("d3_k1", 1, 3)):
    cells = [[r for it, r in zip(items, right) if it.num_attractors == k and it.distance == d]
             for right in rights]
    assert control[key]["n"] == sum(map(len, cells))
    assert control[key]["accuracy"] == pytest.approx(sum(map(sum, cells)) / sum(map(len, cells)))
    per_seed = [sum(c) / len(c) for c in cells]
    assert control[key]["over_seeds"]["mean"] == pytest.approx(np.mean(per_seed))
    assert control[key]["over_seeds"]["sd"] == pytest.approx(np.std(per_seed, ddof=1))
  from scipy import stats  # noqa: PLC0415  # the attractor's cost: paired over seeds
  at3 = lambda k, right: np.mean([r for it, r in zip(items, right)
                                  if it.num_attractors == k and it.distance == 3])
  cost = [at3(0, right) - at3(1, right) for right in rights]
  t = stats.ttest_1samp(cost, 0).confidence_interval()
  assert control["attractor_cost"]["t95"] == pytest.approx([t.low, t.high])
  assert (control["attractor_cost"]["positive_seeds"], control["attractor_cost"]["seeds"]) == (2, 2)


def test_retrieval_pools_seeds_by_position_and_u_test(tmp_path, monkeypatch):
  """Two seeds of one scheme, one fresh (int keys) and one from its JSON cache (str keys):
  the pooled row counts every item once, its U-test is the test on the pooled counts, the
  differences carry mean and sd over the seeds, and the plot draws the scheme once."""
  import matplotlib.pyplot as plt  # noqa: PLC0415
  from experiments.probes import plots, run  # noqa: PLC0415

  def row(rights):  # {position: right of 100}
    counts = {p: (r, 100) for p, r in enumerate(rights)}
    return {"accuracy_by_position": {p: {"accuracy": r / 100, "n": 100,
                                         "wilson95": run.wilson(r, 100)}
                                     for p, (r, _) in counts.items()},
            "context_tokens": 50, "beyond_training": False,
            "mean_accuracy": float(np.mean(rights)) / 100, "u_test": run.u_test(counts)}

  a, b = [90, 60, 50, 60, 95], [80, 70, 40, 70, 85]
  fresh = {8: row(a)}
  cached = json.loads(json.dumps({8: row(b)}))
  pooled = run.pool_retrieval({"0": fresh, "1": cached})
  r = pooled[8]
  assert r["seeds"] == 2 and r["accuracy_by_position"][0]["n"] == 200
  assert r["accuracy_by_position"][0]["accuracy"] == pytest.approx(0.85)
  assert r["accuracy_by_position"][0]["over_seeds"]["sd"] == pytest.approx(np.std([.9, .8], ddof=1))
  assert r["u_test_pooled"] == run.u_test({p: (x + y, 200) for p, (x, y) in enumerate(zip(a, b))})
  ends = [fresh[8]["u_test"]["ends_minus_middle"], cached["8"]["u_test"]["ends_minus_middle"]]
  assert r["ends_minus_middle"]["mean"] == pytest.approx(np.mean(ends))
  assert r["ends_minus_middle"]["sd"] == pytest.approx(np.std(ends, ddof=1))
  assert r["u_shaped_seeds"] == sum(u["u_test"]["u_shaped"] for u in (fresh[8], cached["8"]))
  assert pooled == run.pool_retrieval({"0": json.loads(json.dumps(fresh)), "1": cached})

  results = {"kv_train_pairs": 8, "kv_min_pairs": 2,
             "retrieval": {"alibi": {"0": fresh, "1": cached}},
             "retrieval_pooled": {"alibi": pooled},
             "retrieval_criterion": {"alibi": {"0": {"met": True}, "1": {"met": True}}},
             "agreement": {}}
  text = plots.summary(results)
  assert f"| alibi | 2 | yes | 8 | {np.mean([np.mean(a), np.mean(b)]) / 100:.3f} ± " in text
  figures = []
  monkeypatch.setattr(plt, "close", figures.append)
  plots.retrieval(results, str(tmp_path / "retrieval.png"))
  legend = [t.get_text() for t in figures[0].axes[-1].get_legend().get_texts()]
  assert legend == ["alibi (2 seeds)"]


def test_per_seed_rows_say_when_a_passing_run_is_not_compared():
  """A run that met the criterion on its seed is not compared when another seed of its scheme
  did not: its per-seed rows say so instead of "yes", and so do the over-seeds rows and the
  plot (here on the published gather, with alibi taken out of the compared list)."""
  from experiments.probes import plots  # noqa: PLC0415
  published = ROOT / "experiments/probes/results/grammar_corpus/results.json"
  results = json.loads(published.read_text())
  results["retrieval_compared"][""] = [s for s in results["retrieval_compared"][""]
                                       if s != "alibi"]
  md = plots.summary(results)
  assert "| alibi | 0 | no (met on this seed, not on every seed) | 8 |" in md
  assert "| rope | 0 | yes | 8 |" in md
  assert "| sinusoidal | 0 | no (training failure) | 8 |" in md
  # The over-seeds table and the plot's labels read the same list.
  assert "| alibi | 3 | no (training failure) | 8 |" in md
  assert "| rope | 3 | yes | 8 |" in md
  labels = [label for label, *_ in plots.retrieval_series(results)]
  assert "alibi (3 seeds) [training failure]" in labels and "rope (3 seeds)" in labels
