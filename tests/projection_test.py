"""projection.dot_general: lax.dot_general's values and gradients, with the weight gradient as
an ordinary dot (no contraction over both operands' leading axis) on XLA:CPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from transformer.cpu import projection

# (x shape, w shape, dimension numbers): the projections of the model library, plus the
# layouts the hook must also get right (tied logits contract w's last axis; a permuted one).
CASES = {
    "up I<O": ((24, 8), (8, 16), (((1,), (0,)), ((), ()))),
    "down I>O": ((24, 16), (16, 8), (((1,), (0,)), ((), ()))),
    "square": ((24, 8), (8, 8), (((1,), (0,)), ((), ()))),
    "heads out": ((24, 2, 4), (2, 4, 8), (((1, 2), (0, 1)), ((), ()))),
    "heads in": ((24, 8), (8, 2, 4), (((1,), (0,)), ((), ()))),
    "tied logits": ((24, 8), (12, 8), (((1,), (1,)), ((), ()))),
    "permuted": ((24, 2, 4), (4, 3, 2), (((1, 2), (2, 0)), ((), ()))),
    "batched (fallback)": ((3, 24, 8), (3, 8, 4), (((2,), (1,)), ((0,), (0,)))),
}


def _loss(dot, dn):
  def loss(x, w):
    y = dot(x, w, dn)
    # A nonlinear, position-dependent loss, so the cotangent dy is not a constant.
    return jnp.sum(jnp.sin(y) * jnp.arange(y.size).reshape(y.shape))
  return loss


@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_match_lax(name):
  x_shape, w_shape, dn = CASES[name]
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
  w = jnp.asarray(rng.normal(size=w_shape), jnp.float32)
  np.testing.assert_array_equal(projection.dot_general(x, w, dn), lax.dot_general(x, w, dn))
  want = jax.jit(jax.grad(_loss(lax.dot_general, dn), (0, 1)))(x, w)
  got = jax.jit(jax.grad(_loss(projection.dot_general, dn), (0, 1)))(x, w)
  for g, r in zip(got, want):
    assert g.shape == r.shape and g.dtype == r.dtype
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-4)


def test_bfloat16_gradients_keep_the_parameter_dtype():
  x = jnp.ones((16, 8), jnp.bfloat16)
  w = jnp.ones((8, 4), jnp.bfloat16)
  dn = (((1,), (0,)), ((), ()))
  gx, gw = jax.grad(lambda x, w: projection.dot_general(x, w, dn).astype(jnp.float32).sum(),
                    (0, 1))(x, w)
  assert gx.dtype == gw.dtype == jnp.bfloat16
  np.testing.assert_array_equal(gw.astype(jnp.float32), 16.0)


def _leading_axis_dots(hlo: str) -> list:
  """Dots in compiled HLO that contract the leading axis of a 2-D lhs (the slow layout)."""
  return [line for line in hlo.splitlines()
          if re.search(r"\bdot\(", line) and "lhs_contracting_dims={0}" in line]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU layout is the point")
@pytest.mark.parametrize("name", ["up I<O", "down I>O", "square"])
def test_weight_gradient_is_not_a_leading_axis_contraction(name):
  x_shape, w_shape, dn = CASES[name]
  x, w = jnp.ones(x_shape), jnp.ones(w_shape)
  hlo = lambda dot: jax.jit(jax.grad(_loss(dot, dn), 1)).lower(x, w).compile().as_text()
  # The reference really has the layout the hook avoids, so this test can fail.
  assert _leading_axis_dots(hlo(lax.dot_general))
  assert not _leading_axis_dots(hlo(projection.dot_general))


def _fused_transposes_with_arithmetic(hlo: str) -> list:
  """Fused computations of compiled HLO that transpose and also compute (the slow loop)."""
  bodies = re.findall(r"^%\S+ \(.*?\) -> .*?\{\n(.*?)\n\}", hlo, re.M | re.S)
  op = lambda name: re.compile(r"\} " + name + r"\(")
  return [b for b in bodies if op("transpose").search(b)
          and op("(multiply|add|subtract|divide)").search(b)]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU fusion is the point")
def test_transposed_copy_reads_a_materialized_operand():
  # x * s stands for the RMS norm that makes a projection's input.
  x, s, dy = jnp.ones((24, 8)), jnp.ones(8), jnp.ones((24, 16))
  def hlo(transpose):
    weight_grad = lambda x, s, dy: transpose(x * s) @ dy
    return jax.jit(weight_grad).lower(x, s, dy).compile().as_text()
  # Behind optimization barriers the multiply is still fused into the transpose: the test
  # can fail.
  assert _fused_transposes_with_arithmetic(hlo(lambda a: lax.optimization_barrier(a.T)))
  assert not _fused_transposes_with_arithmetic(hlo(projection.transpose))
  # And in the projection's own backward pass.
  loss = lambda x, s, w: jnp.sum(jnp.sin(projection.dot_general(x * s, w, CASES["up I<O"][2])))
  compiled = jax.jit(jax.grad(loss, 2)).lower(x, s, jnp.ones((8, 16))).compile().as_text()
  assert not _fused_transposes_with_arithmetic(compiled)


def test_transpose_matches_numpy():
  x = jnp.arange(24.0).reshape(2, 3, 4)
  for axes in (None, (1, 0, 2), (2, 0, 1)):
    np.testing.assert_array_equal(jax.jit(projection.transpose, static_argnums=1)(x, axes),
                                  np.transpose(np.asarray(x), axes))
