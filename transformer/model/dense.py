"""Dense: the one projection wrapper every learned projection of the model goes through.

It owns what the model files would otherwise repeat: the kernel's and bias's logical axis
names (which transformer/training/sharding.py maps to mesh axes), the logical names of its
output activation (batch, length, then the kernel's output axes) as a sharding constraint,
the dtypes from the model config, the token flattening, and the `dot_general` hook
(transformer/cpu/projection.py: weight gradients laid out for XLA:CPU; plain lax.dot_general
elsewhere).

Its parameters are exactly nn.DenseGeneral's (names, shapes and values: DenseGeneral draws a
kernel as a 2-D [in, out] matrix and reshapes it, and so does this), so checkpoints and the
Hugging Face converters see no difference. It is not a DenseGeneral because DenseGeneral
wraps its initializer around that 2-D draw: a 3-D kernel's logical partitioning then meets a
2-D array, which fails under a global mesh (google/flax#3676), and with no global mesh every
activation constraint in the model is a no-op. Here the partitioning wraps the reshaped
kernel, so training installs the mesh (sharding.activate) and the constraints take effect.
"""

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer.cpu import projection


def logical_spec(shape: Sequence[int], names: Sequence[str | None]):
  """The PartitionSpec that logical axis `names` give an array of `shape` under the mesh and
  rules of sharding.activate, or None outside it. Unlike nn.logical_to_mesh_axes, a dimension
  that its mesh axes do not divide stays whole, as sharding.logical_to_spec leaves such a
  parameter dimension (4 heads on tensor=8): an uneven split would pad every shard and put
  the activation out of step with its weight."""
  mesh = jax.sharding.get_abstract_mesh()
  spec = None if mesh.empty else nn.logical_to_mesh_axes(names)
  if spec is None:
    return None
  def divides(axes, size):
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return size % int(np.prod([mesh.shape[a] for a in axes])) == 0
  return jax.sharding.PartitionSpec(*(axes if axes is None or divides(axes, size) else None
                                      for axes, size in zip(spec, shape)))


def constrain(x, names: Sequence[str | None]):
  """Constrain activation x's sharding by logical axis `names` (logical_spec); a no-op
  outside sharding.activate."""
  spec = logical_spec(x.shape, names)
  return x if spec is None else jax.lax.with_sharding_constraint(x, spec)


def _drawn_2d(init, contracted: int):
  """`init` drawn as DenseGeneral draws it ([prod(in), prod(out)]), reshaped to the kernel."""
  def draw(rng, shape, dtype=jnp.float32):
    flat = (int(np.prod(shape[:contracted])), int(np.prod(shape[contracted:])))
    return jnp.reshape(init(rng, flat, dtype), shape)
  return draw


class _TokenDense(nn.Module):
  """x [B, L, ...] projected along `axis` (axes of x, not counting B and L) onto `features`,
  with its tokens flattened into one axis: on XLA:CPU a [B, L, D] operand makes the backward
  pass write transposed copies of the activation gradients (docs/performance.md)."""
  features: tuple[int, ...]
  axis: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_axes: tuple[str, ...]
  use_bias: bool
  dtype: jnp.dtype
  param_dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    B, L = x.shape[:2]
    x_T = x.reshape(B * L, *x.shape[2:])
    # In the order given, as DenseGeneral orders the kernel's contracted axes.
    axis = tuple(a % x.ndim - 1 for a in self.axis)
    if any(a < 1 for a in axis):
      raise ValueError(f"Dense projects feature axes, not the batch or length: axis={self.axis}")
    kernel_shape = tuple(x_T.shape[a] for a in axis) + self.features
    kernel = self.param("kernel", nn.with_logical_partitioning(
        _drawn_2d(nn.initializers.lecun_normal(), len(axis)), self.kernel_axes),
        kernel_shape, self.param_dtype)
    bias = None
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                             self.bias_axes),
                        self.features, self.param_dtype)
    x_T, kernel, bias = nn.dtypes.promote_dtype(x_T, kernel, bias, dtype=self.dtype)
    y = projection.dot_general(x_T, kernel, ((axis, tuple(range(len(axis)))), ((), ())))
    if bias is not None:
      y += bias
    y = y.reshape(B, L, *self.features)
    out_axes = self.kernel_axes[len(axis):]
    # A projection back into the residual stream hands its sum over heads / mlp units out
    # split by position, as the stream is between sub-layers (layers.py Block), so the tensor
    # axis reduce-scatters it rather than all-reducing a whole copy onto every device.
    length = "residual_length" if out_axes == ("embed",) else "length"
    return constrain(y, ("batch", length, *out_axes))


def Dense(features: int | Sequence[int], kernel_axes: Sequence[str], *,  # pylint: disable=invalid-name
          cfg: ml_collections.ConfigDict, name: str, axis: int | Sequence[int] = -1,
          use_bias: bool | None = None, bias_axes: Sequence[str] | None = None) -> nn.Module:
  """A projection of x's `axis` onto `features`. `kernel_axes` names the kernel's axes (inputs
  then outputs); the bias's default to the output ones. `use_bias` defaults to cfg.use_bias."""
  features = (features,) if isinstance(features, int) else tuple(features)
  axis = (axis,) if isinstance(axis, int) else tuple(axis)
  bias_axes = tuple(kernel_axes[len(axis):]) if bias_axes is None else tuple(bias_axes)
  return _TokenDense(
      features=features, axis=axis, kernel_axes=tuple(kernel_axes), bias_axes=bias_axes,
      use_bias=cfg.use_bias if use_bias is None else use_bias,
      dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype), name=name)
