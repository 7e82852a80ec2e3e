"""The matmul of every learned projection, with a weight gradient laid out for XLA:CPU.

A projection y[T, O] = x[T, I] W[I, O] over T tokens has the weight gradient x^T dy, a
contraction over the leading (token) axis of both operands. XLA:CPU hands a dot whose
operands are contracted on their leading axis to Eigen, which runs it at about half of
peak when I > O. Given an operand transposed in
memory, [I, T] x [T, O] is an ordinary dot that XLA:CPU runs on YNNPACK near peak. The copy
costs one pass over the smaller operand, if it is a plain copy (see `transpose`). Other
backends take operands in either order at no cost, so they get lax.dot_general unchanged, as
does any contraction that is not [T, ...] x W.

Figures (experiments/benchmarks/train_throughput.py): docs/performance.md.
"""

import functools

import jax
from jax import lax
import numpy as np


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """lax.dot_general's signature (flax's `dot_general=` hook); same values and gradients."""
  (lhs_contract, rhs_contract), batch = dimension_numbers
  tokens_first = tuple(lhs_contract) == tuple(range(1, lhs.ndim)) and lhs.ndim >= 2
  if jax.default_backend() != "cpu" or any(batch) or not tokens_first:
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)
  return _token_dot(lhs, rhs, tuple(rhs_contract), precision, preferred_element_type)


def _dimension_numbers(x, rhs_contract):
  return (tuple(range(1, x.ndim)), rhs_contract), ((), ())


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _token_dot(x, w, rhs_contract, precision, preferred_element_type):
  return lax.dot_general(x, w, _dimension_numbers(x, rhs_contract), precision=precision,
                         preferred_element_type=preferred_element_type)


def _token_dot_fwd(x, w, rhs_contract, precision, preferred_element_type):
  return _token_dot(x, w, rhs_contract, precision, preferred_element_type), (x, w)


def _token_dot_bwd(rhs_contract, precision, preferred_element_type, residuals, dy):
  x, w = residuals
  dot = functools.partial(lax.dot_general, precision=precision,
                          preferred_element_type=preferred_element_type)
  # The input gradient dy W^T already contracts trailing axes: autodiff's own is fine.
  _, x_vjp = jax.vjp(lambda x: dot(x, w, _dimension_numbers(x, rhs_contract)), x)
  (dx,) = x_vjp(dy)

  T = x.shape[0]
  x_2d, dy_2d = x.reshape(T, -1), dy.reshape(T, -1).astype(x.dtype)  # [T, I], [T, O]
  barrier = lax.optimization_barrier
  plain = (((1,), (0,)), ((), ()))
  # The copied operand is the smaller one; the product comes out [min, max] and a transpose
  # of the (small) weight gradient puts it back when I > O.
  if x_2d.shape[1] <= dy_2d.shape[1]:
    dw_2d = dot(transpose(x_2d), dy_2d, plain)
  else:
    dw_2d = barrier(dot(transpose(dy_2d), x_2d, plain)).T
  dw_2d = barrier(dw_2d)
  # [I, O] -> w's own axis order: its contracted axes (in rhs_contract order), then the rest.
  free = tuple(a for a in range(w.ndim) if a not in rhs_contract)
  dw = dw_2d.reshape([w.shape[a] for a in rhs_contract + free])
  dw = dw.transpose(np.argsort(rhs_contract + free))
  return dx, dw.astype(w.dtype)


_token_dot.defvjp(_token_dot_fwd, _token_dot_bwd)


def transpose(x, axes=None):
  """x.transpose(axes) as a plain copy of a materialized x.

  XLA:CPU fuses the elementwise producer of a transposed operand (here usually the RMS norm
  that made a projection's input) into the transpose, and such a fusion runs as a slow
  element-by-element loop: 2.8 ms against 0.23 ms for the copy alone, for a 2048 x 512 fp32
  operand on one core. Optimization barriers do not stop that fusion; a conditional's
  operand is always materialized, so the transpose sits in a two-way cond whose branches are
  the same (the predicate is behind a barrier only so that XLA keeps the cond). Other
  backends get the plain transpose."""
  if jax.default_backend() != "cpu":
    return x.transpose(axes)
  pred = lax.optimization_barrier(np.bool_(True))
  f = lambda y: y.transpose(axes)
  return lax.cond(pred, f, f, x)
