"""Dense, the model's one projection wrapper: its parameters are nn.DenseGeneral's (names,
shapes and initial values, as its docstring promises checkpoints and the converters), and its
output is the numpy contraction plus the bias."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from transformer.model.dense import Dense
from tests.helpers.tiny_models import tiny


@pytest.mark.parametrize("features,axes,axis", [
    ((48,), ("embed", "mlp"), -1),                          # the feed-forward's first layer
    ((4, 8), ("embed", "heads", "head_dim"), -1),           # a query projection
    ((16,), ("heads", "head_dim", "embed"), (-2, -1)),      # the attention's out projection
])
def test_dense_is_dense_general_with_its_bias(features, axes, axis):
  cfg = tiny("decoder", "none", d_model=16, use_bias=True)
  shape = (2, 3, 16) if axis == -1 else (2, 3, 2, 8)
  x = jax.random.normal(jax.random.key(0), shape)
  ours = Dense(features, axes, cfg=cfg, name="d", axis=axis)
  variables = nn.unbox(ours.init(jax.random.key(1), x))
  reference = nn.DenseGeneral(features, axis=axis, use_bias=True).init(jax.random.key(1), x)
  assert jax.tree.map(np.shape, variables) == jax.tree.map(np.shape, reference)
  np.testing.assert_array_equal(variables["params"]["kernel"],
                                reference["params"]["kernel"])  # the same initial draw

  bias = np.random.default_rng(2).normal(size=features).astype(np.float32)
  variables["params"]["bias"] = bias
  kernel = np.asarray(variables["params"]["kernel"])
  contracted = 1 if axis == -1 else 2
  want = np.tensordot(np.asarray(x), kernel, axes=contracted) + bias
  np.testing.assert_allclose(ours.apply(variables, x), want, rtol=1e-5, atol=1e-5)
