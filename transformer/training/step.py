"""The jitted functions of training: one optimizer update from a global batch, and the loss
sums of one evaluation batch."""

import jax
import jax.numpy as jnp
import optax

from transformer.training import losses


def make_train_step(loss_fn, tx, schedule, accum_steps: int):
  """One optimizer update from a global batch, averaging over its real tokens."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state, batch):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
    if accum_steps == 1:
      (loss_sum, sums), grad_sums = grad_fn(state["params"], batch, rng, False)
    else:
      # Micro-batch m takes rows m, m+A, m+2A, ...: every device keeps its own rows, so
      # splitting moves no data between devices.
      micro = jax.tree.map(
          lambda x: x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:])
          .swapaxes(0, 1), batch)

      def add_micro(carry, index_and_batch):
        index, micro_batch = index_and_batch
        out = grad_fn(state["params"], micro_batch, jax.random.fold_in(rng, index), False)
        return jax.tree.map(jnp.add, carry, out), None
      zeros = jax.eval_shape(grad_fn, state["params"], jax.tree.map(lambda x: x[0], micro),
                             rng, False)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
      ((loss_sum, sums), grad_sums), _ = jax.lax.scan(
          add_micro, zeros, (jnp.arange(accum_steps), micro))
    # Sums over all micro-batches and devices divided once: the loss per real token.
    count = jnp.maximum(sums["weight_sum"], 1.0)
    # In the parameters' dtype: a float32 count would otherwise promote bfloat16 gradients,
    # and the optimizer state with them, so the next step's state no longer matches.
    grads = jax.tree.map(lambda g: (g / count).astype(g.dtype), grad_sums)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    grad_norm = optax.tree.norm(grads)
    metrics = {"loss": loss_sum / count, "accuracy": sums["correct_sum"] / count,
               "grad_norm": grad_norm, "learning_rate": schedule(state["step"]),
               "real_tokens": sums["weight_sum"],
               # Params after this step are good iff the loss and gradients were finite.
               "finite": jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)}
    new_state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1,
                 "rng": state["rng"]}
    return new_state, metrics

  return train_step


def make_eval_step(loss_fn, objective_name: str):
  """eval_step(params, batch, token_bytes) -> the batch's sums, with `byte_sum` (the bytes of
  its weighted targets' text, for bits per byte) from token_bytes = {"token_bytes_2V": the
  tokenizer's table, "bos_id": its BOS}."""
  def eval_step(params, batch, token_bytes):
    _, sums = loss_fn(params, batch, jax.random.key(0), True)
    sums["byte_sum"] = losses.target_bytes(objective_name, batch, token_bytes["token_bytes_2V"],
                                           token_bytes["bos_id"])
    return sums
  return eval_step
