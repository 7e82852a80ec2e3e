"""Dense: the one projection wrapper every learned projection of the model goes through.

It owns what the model files would otherwise repeat: the kernel's and bias's logical axis
names (which transformer/training/sharding.py maps to mesh axes), the dtypes from the model
config, the token flattening, and the `dot_general` hook (transformer/cpu/projection.py: weight
gradients laid out for XLA:CPU; plain lax.dot_general elsewhere). It is an nn.DenseGeneral, so
parameter names, shapes and values are exactly DenseGeneral's.
"""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from transformer.cpu import projection


class _TokenDense(nn.DenseGeneral):
  """DenseGeneral applied to x [B, L, ...] with its tokens flattened into one axis: the same
  parameters and result; on XLA:CPU a [B, L, D] operand makes the backward pass write
  transposed copies of the activation gradients (docs/performance.md)."""

  def __call__(self, x):
    y = super().__call__(x.reshape(-1, *x.shape[2:]))
    return y.reshape(*x.shape[:2], *y.shape[1:])


def Dense(features: int | Sequence[int], kernel_axes: Sequence[str], *,  # pylint: disable=invalid-name
          cfg: ml_collections.ConfigDict, name: str, axis: int | Sequence[int] = -1,
          use_bias: bool | None = None, bias_axes: Sequence[str] | None = None) -> nn.Module:
  """A projection of x's `axis` onto `features`. `kernel_axes` names the kernel's axes (inputs
  then outputs); the bias's default to the output ones. `use_bias` defaults to cfg.use_bias."""
  contracted = 1 if isinstance(axis, int) else len(axis)
  bias_axes = tuple(kernel_axes[contracted:]) if bias_axes is None else tuple(bias_axes)
  return _TokenDense(
      features=features, axis=axis, use_bias=cfg.use_bias if use_bias is None else use_bias,
      dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype),
      dot_general=projection.dot_general,
      kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                               tuple(kernel_axes)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, bias_axes), name=name)
