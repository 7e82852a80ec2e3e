"""launch/sweep.py: --sweep/--trials/--sweep_seed (on a config without a sweep block), a
launcher's --config flags against the swept keys, and tuple-valued axes."""

import json

import numpy as np
import pytest

from configs import lm
from launch import sweep

AXES = "opt.lr=loguniform(1e-4,1e-2);model.num_layers=choice(2,4,6)"


def _trials(seed):
  config = lm.get_config("size=xs")
  assert "sweep" not in config  # the case: no sweep.seed a --config flag could set
  return sweep.expand(sweep.with_sweep_flag(config, AXES, trials=6, seed=seed))


def test_sweep_seed_draws_other_trials_and_the_same_ones_again():
  assert _trials(None) == _trials(0)  # the default draws as before
  assert _trials(1) == _trials(1)
  assert [r["overrides"] for r in _trials(1)] != [r["overrides"] for r in _trials(2)]


def test_sweep_seed_without_a_random_search_is_refused():
  with pytest.raises(ValueError, match="--sweep_seed seeds a random search"):
    sweep.with_sweep_flag(lm.get_config("size=xs"), "opt.lr=1e-3,3e-3", trials=0, seed=3)


def test_a_random_axis_without_trials_says_to_give_trials():
  config = lm.get_config("size=xs")
  with pytest.raises(ValueError, match=r"opt.lr=loguniform\(1e-4,1e-2\) is a random-search "
                                       r"distribution: give --trials=N"):
    sweep.expand(sweep.with_sweep_flag(config, "opt.lr=loguniform(1e-4,1e-2)", trials=None))


@pytest.mark.parametrize("trials", [0, -2])
def test_trials_below_one_are_refused(trials):
  with pytest.raises(ValueError, match=f"--trials must be at least 1 .*got {trials}"):
    sweep.with_sweep_flag(lm.get_config("size=xs"), AXES, trials=trials)
  config = sweep.with_sweep_flag(lm.get_config("size=xs"), AXES, trials=4)
  config.sweep.trials = trials  # a config's own random sweep
  with pytest.raises(ValueError, match=f"needs trials >= 1 .*got {trials}"):
    sweep.expand(config)


def test_a_passed_through_flag_for_a_swept_key_is_refused_before_sweep_json(tmp_path):
  config = sweep.with_sweep_flag(lm.get_config("size=xs"), "opt.lr=1e-3,3e-3", trials=None)
  with pytest.raises(ValueError, match="--config.opt.lr would be ignored: the sweep sets"):
    sweep.plan(config, str(tmp_path / "w"), config_arg="c.py", module="fake",
               extra_flags=["--config.train.seed=1", "--config.opt.lr=0.01"])
  assert not (tmp_path / "w").exists()
  assert sweep.plan(config, str(tmp_path / "w"), config_arg="c.py", module="fake",
                    extra_flags=["--config.train.seed=1"])  # another key passes through


def test_a_tuple_field_is_swept_as_tuples():
  config = sweep.with_sweep_flag(lm.get_config("size=xs"), "mesh.shape=(1,1,1),(-1,1,1)",
                                 trials=None)
  runs = sweep.expand(config)
  assert [r["overrides"]["mesh.shape"] for r in runs] == [(1, 1, 1), (-1, 1, 1)]
  assert [r["name"] for r in runs] == ["shape=1x1x1", "shape=-1x1x1"]
  assert "--config.mesh.shape=(1,1,1)" in sweep.train_command(
      "python", "m", "c.py", "d", runs[0]["overrides"])
  sweep.check_run_configs(config, runs)  # the train command's checks take them
  draws = sweep.with_sweep_flag(lm.get_config("size=xs"), "mesh.shape=choice((1,1,1),(2,1,1))",
                                trials=4)
  assert {r["overrides"]["mesh.shape"] for r in sweep.expand(draws)} <= {(1, 1, 1), (2, 1, 1)}


@pytest.mark.parametrize("value", ["1,1,1", "(a,1,1)", "(1,1", "(1.5,1,1)"])
def test_a_tuple_field_refuses_what_is_not_a_tuple_of_its_type(value):
  config = sweep.with_sweep_flag(lm.get_config("size=xs"), f"mesh.shape={value}", trials=None)
  with pytest.raises(ValueError, match=r"for mesh.shape is not a tuple like the config's "
                                       r"\(-1,1,1\): write each in parentheses"):
    sweep.expand(config)


def test_a_sweep_and_an_experiment_refuse_each_others_directories(tmp_path):
  # Each writes results.md: the other's (an experiment's table, a sweep's table and fits)
  # would be overwritten.
  from experiments import results
  experiment, grid = tmp_path / "experiment", tmp_path / "grid"
  experiment.mkdir()
  (experiment / "results.json").write_text('{"experiment": "experiments.extrapolation.run"}')
  config = sweep.with_sweep_flag(lm.get_config("size=xs"), "opt.lr=1e-3,3e-3", trials=None)
  for write in (True, False):
    with pytest.raises(ValueError, match=r"holds an experiment's results \(results.json\), whose "
                                         r"results.md a sweep would overwrite; use a new"):
      sweep.plan(config, str(experiment), config_arg="configs/lm.py", write=write)
  assert not (experiment / "sweep.json").exists()
  sweep.plan(config, str(grid), config_arg="configs/lm.py")
  with pytest.raises(ValueError, match=r"grid is a sweep directory \(sweep.json\), whose "
                                       r"results.md this experiment would overwrite"):
    results.check_workdir(str(grid), "experiments.extrapolation.run")
  results.check_workdir(str(experiment), "experiments.extrapolation.run")


def test_a_finished_run_trained_with_other_settings_is_not_taken_as_the_sweeps(tmp_path):
  config = sweep.with_sweep_flag(lm.get_config("size=xs"), "opt.lr=1e-3,3e-3", trials=None)
  planned = sweep.check_run_configs(config, sweep.expand(config))
  run = tmp_path / "lr=0.001"
  run.mkdir()
  write = lambda flat: (run / "summary.json").write_text(json.dumps({"config": flat}))
  # Where it ran and how it was logged: the same run (the plan is written).
  write({**planned["lr=0.001"], "train.log_every": 7, "data.data_dir": "/elsewhere"})
  sweep.plan(config, str(tmp_path), config_arg="configs/lm.py")
  # An edited config file (or a run copied in): refused before anything launches.
  write({**planned["lr=0.001"], "model.d_model": 32, "train.steps": 5})
  with pytest.raises(ValueError, match=r"lr=0.001 finished with other settings than this sweep "
                                       r"gives it \(model.d_model: 32 there vs 64 now, "
                                       r"train.steps: 5 there vs \d+ now\), so it would be "
                                       r"skipped as this sweep's run; use a new --workdir"):
    sweep.plan(config, str(tmp_path), config_arg="configs/lm.py")
  (run / "config.json").write_text(json.dumps({"model": {"d_model": 64}}))  # read first
  sweep.plan(config, str(tmp_path), config_arg="configs/lm.py")


def _random_runs(axes, trials, seed=0):
  return sweep.expand(sweep.with_sweep_flag(lm.get_config("size=xs"), axes, trials=trials,
                                            seed=seed))


def test_loguniform_draws_are_uniform_in_log_space():
  """loguniform(1e-4, 1e-2): half the draws below the geometric mean 1e-3, a quarter below
  10^-3.5 (a uniform draw would put only ~9% below 1e-3)."""
  lrs = np.array([r["overrides"]["opt.lr"] for r in _random_runs("opt.lr=loguniform(1e-4,1e-2)", 400)])
  assert len(lrs) > 300 and lrs.min() >= 1e-4 and lrs.max() <= 1e-2
  assert 0.4 < np.mean(lrs < 1e-3) < 0.6
  assert 0.15 < np.mean(lrs < 10 ** -3.5) < 0.35


def test_int_axis_is_inclusive_and_choice_reaches_every_value():
  """int(a, b) draws a..b inclusive; choice draws each listed value."""
  runs = _random_runs("model.num_layers=int(1,3);model.num_heads=choice(1,2,4)", 40)
  layers = {r["overrides"]["model.num_layers"] for r in runs}
  heads = {r["overrides"]["model.num_heads"] for r in runs}
  assert layers == {1, 2, 3} and heads == {1, 2, 4}
  assert len(runs) == 9  # every (layers, heads) pair, repeats dropped


def test_an_extended_sweep_keeps_its_finished_runs(tmp_path):
  """The sweep block is no setting of a run: a grid extended by a value (sweep.axes changed)
  still takes its finished runs as its own, and the same init_from written another way is
  the same."""
  config = sweep.with_sweep_flag(lm.get_config("size=xs"), "opt.lr=1e-3,3e-3", trials=None)
  planned = sweep.check_run_configs(config, sweep.expand(config))
  run = tmp_path / "lr=0.001"
  run.mkdir()
  saved = {**planned["lr=0.001"], "sweep.axes": "opt.lr=1e-3"}
  (run / "summary.json").write_text(json.dumps({"config": saved}))
  sweep.plan(config, str(tmp_path), config_arg="configs/lm.py")
  config.train.init_from = "runs/base"
  planned = sweep.check_run_configs(config, sweep.expand(config))
  saved = {**planned["lr=0.001"], "train.init_from": "runs/./base/"}
  (run / "summary.json").write_text(json.dumps({"config": saved}))
  sweep.plan(config, str(tmp_path), config_arg="configs/lm.py")
