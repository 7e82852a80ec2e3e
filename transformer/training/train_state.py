"""The train state: what it holds, how it is initialized, and where each piece lives.

    state = {"params": ..., "opt_state": ..., "step": int32[], "rng": uint32[key]}

A plain dict (no class) so orbax, jit and tree utilities see ordinary pytrees. `rng` is the
run's base key as raw key data; step k's randomness is fold_in(rng, k), so a resumed run
draws exactly the dropout masks the uninterrupted run would have.

Everything is derived from an abstract (shape-only) trace first: shardings come from the
logical axis names on the parameters, and the real initialization is one jit whose outputs
are created already sharded; no full copy of the model ever sits on one device.
"""

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from transformer.training import sharding


def example_inputs(config) -> tuple:
  """Token arrays whose shapes `model.init` traces through (one row, full length)."""
  tokens = jnp.zeros((1, config.data.seq_len), jnp.int32)
  if config.model.kind == "encoder_decoder":
    return (tokens, tokens)
  return (tokens,)


def abstract_params(model, config):
  """(logical names, shapes) of the parameters, without allocating them."""
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), *example_inputs(config)))
  names = nn.get_partition_spec(boxed)["params"]
  return names, nn.meta.unbox(boxed)["params"]


def make_init(model, config, tx: optax.GradientTransformation) -> Callable:
  """init(seed) -> state. Param init and the base training key come from separate streams."""
  def init(seed):
    init_rng, train_rng = jax.random.split(jax.random.key(seed))
    variables = model.init(init_rng, *example_inputs(config))
    params = nn.meta.unbox(variables)["params"]
    return {"params": params, "opt_state": tx.init(params),
            "step": jnp.zeros((), jnp.int32), "rng": jax.random.key_data(train_rng)}
  return init


def make_init_from_params(tx: optax.GradientTransformation) -> Callable:
  """init(seed, params) -> state around given parameters (fine-tuning): a fresh optimizer
  state and step 0, with the base training key `make_init` would draw from `seed`."""
  def init(seed, params):
    _, train_rng = jax.random.split(jax.random.key(seed))
    return {"params": params, "opt_state": tx.init(params),
            "step": jnp.zeros((), jnp.int32), "rng": jax.random.key_data(train_rng)}
  return init


def shardings(init: Callable, logical_names, params_shapes, mesh):
  """(abstract state, state shardings) for `init`'s output on `mesh`."""
  abstract_state = jax.eval_shape(init, 0)
  param_sh = sharding.param_shardings(logical_names, params_shapes, mesh)
  replicated = NamedSharding(mesh, P())
  state_sh = {
      "params": param_sh,
      "opt_state": sharding.like_params_shardings(
          abstract_state["opt_state"], params_shapes, param_sh, mesh),
      "step": replicated,
      "rng": replicated,
  }
  abstract_state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract_state, state_sh)
  return abstract_state, state_sh

