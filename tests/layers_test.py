"""layers: the exact GELU against the erf formula in float64 (and its derivative)."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import layers

_X = np.concatenate([np.linspace(-12, 12, 2001), [-40.0, -6.5, 0.0, 1e-6, 40.0]])


def test_gelu_matches_the_erf_formula_in_float64():
  want = np.array([0.5 * x * (1 + math.erf(x / math.sqrt(2))) for x in _X])
  got = np.asarray(jax.jit(layers.gelu)(jnp.asarray(_X, jnp.float32)), np.float64)
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
  # The same function as jax.nn.gelu's erfc form, to float32 rounding.
  np.testing.assert_allclose(got, jax.nn.gelu(jnp.asarray(_X, jnp.float32), approximate=False),
                             rtol=2e-6, atol=2e-6)


def test_gelu_derivative_is_phi_plus_x_times_density():
  want = np.array([0.5 * (1 + math.erf(x / math.sqrt(2)))
                   + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) for x in _X])
  got = jax.jit(jax.vmap(jax.grad(layers.gelu)))(jnp.asarray(_X, jnp.float32))
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-6)
