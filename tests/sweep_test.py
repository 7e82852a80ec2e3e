"""launch/sweep.py: --sweep/--trials/--sweep_seed on a config without a sweep block."""

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
