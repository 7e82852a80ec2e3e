"""transformer/training/train_state.py: the initial training state and its keys."""

import flax.linen as nn
import numpy as np
import optax

from helpers import tiny_run
from transformer.training import train_state


def test_a_fine_tune_draws_the_training_key_a_fresh_run_of_its_seed_would(tmp_path):
  """make_init_from_params keeps make_init's base training key for the seed (dropout masks
  follow train.seed however the parameters were made), and starts at step 0."""
  class Tiny(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(3)(x)
  config = tiny_run.tiny_config(str(tmp_path))
  tx = optax.sgd(0.1)
  model = Tiny()
  fresh = train_state.make_init(model, config, tx)(5)
  tuned = train_state.make_init_from_params(tx)(5, fresh["params"])
  np.testing.assert_array_equal(tuned["rng"], fresh["rng"])
  assert int(tuned["step"]) == 0
