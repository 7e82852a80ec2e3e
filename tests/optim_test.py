"""Schedules have the shapes their names promise; every optimizer descends; decay is masked."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from transformer import schema
from transformer.training import optim


def _cfg(**kw):
  return schema.opt_config(**kw)


def test_cosine_warms_up_then_ends_at_floor():
  s = optim.make_schedule(_cfg(lr=1.0, warmup_steps=10, min_lr_ratio=0.1), 110)
  assert float(s(0)) == pytest.approx(0.1)
  assert float(s(9)) == pytest.approx(1.0)
  assert float(s(60)) == pytest.approx(0.55, abs=1e-6)  # halfway through the cosine
  assert float(s(110)) == pytest.approx(0.1)


def test_linear_and_constant():
  lin = optim.make_schedule(_cfg(lr=2.0, schedule="linear", warmup_steps=0, min_lr_ratio=0.0), 100)
  assert float(lin(50)) == pytest.approx(1.0)
  # With a warm-up the decay spans the steps after it: halfway at step 60 of 10 + 100.
  lin = optim.make_schedule(_cfg(lr=1.0, schedule="linear", warmup_steps=10, min_lr_ratio=0.1),
                            110)
  assert [float(lin(i)) for i in (9, 60, 110)] == pytest.approx([1.0, 0.55, 0.1])
  const = optim.make_schedule(_cfg(lr=2.0, schedule="constant", warmup_steps=4), 100)
  assert [float(const(i)) for i in (0, 3, 99)] == pytest.approx([0.5, 2.0, 2.0])


def test_rsqrt_is_continuous_after_warmup():
  s = optim.make_schedule(_cfg(lr=1.0, schedule="rsqrt", warmup_steps=100), 10_000)
  assert float(s(99)) == pytest.approx(1.0)
  assert float(s(399)) == pytest.approx(0.5)


def test_wsd_is_flat_then_cools_down():
  s = optim.make_schedule(_cfg(lr=1.0, schedule="wsd", warmup_steps=10, decay_fraction=0.2,
                               min_lr_ratio=0.0), 100)
  assert [float(s(i)) for i in (20, 79, 90, 100)] == pytest.approx([1.0, 1.0, 0.5, 0.0])


@pytest.mark.parametrize("key,value", [("name", "adamx"), ("schedule", "cosin")])
def test_unknown_names_list_the_valid_ones(key, value):
  with pytest.raises(ValueError, match="valid:"):
    optim.make_schedule(_cfg(**{key: value}), 10)


@pytest.mark.parametrize("key,value,message", [
    ("b1", 1.5, r"opt.b1 must be in \[0, 1\), got 1.5"),
    ("b2", 1.0, r"opt.b2 must be in \[0, 1\)"), ("momentum", -0.1, r"opt.momentum must be in"),
    ("eps", -1e-8, "opt.eps must be >= 0"), ("weight_decay", -0.1, "opt.weight_decay must be"),
    ("clip_norm", float("nan"), "opt.clip_norm must be >= 0, got nan"),
    ("min_lr_ratio", 1.5, r"opt.min_lr_ratio must be in \[0, 1\]"),
])
def test_out_of_range_numbers_are_refused(key, value, message):
  with pytest.raises(ValueError, match=message):
    optim.check_config(_cfg(**{key: value}))


@pytest.mark.parametrize("name", sorted(optim.OPTIMIZERS))
def test_every_optimizer_descends(name):
  target = jnp.arange(4.0)
  params = {"w": jnp.zeros((4, 4)), "b": jnp.zeros((4,))}
  loss = lambda p: jnp.sum((p["w"] @ target - 1.0) ** 2) + jnp.sum((p["b"] - 1.0) ** 2)
  tx = optim.make_optimizer(_cfg(name=name, lr=0.05, warmup_steps=0, schedule="constant"), 50)
  state = tx.init(params)
  start = float(loss(params))
  for _ in range(30):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    params = optax.apply_updates(params, updates)
  assert float(loss(params)) < 0.5 * start


def test_decay_mask_uses_logical_names_not_ndim():
  names = {"kernel": P("embed", "mlp"), "scale": P("embed"), "stacked_scale": P("layers", "embed"),
           "unnamed_matrix": P(), "unnamed_vector": P(),
           "query": {"kernel": P("embed", "heads", "head_dim"), "bias": P("heads", "head_dim")}}
  shapes = {"kernel": jnp.zeros((2, 3)), "scale": jnp.zeros(2), "stacked_scale": jnp.zeros((4, 2)),
            "unnamed_matrix": jnp.zeros((2, 2)), "unnamed_vector": jnp.zeros(2),
            "query": {"kernel": jnp.zeros((2, 2, 3)), "bias": jnp.zeros((2, 3))}}
  mask = optim.weight_decay_mask(names, shapes)
  assert mask == {"kernel": True, "scale": False, "stacked_scale": False,
                  "unnamed_matrix": True, "unnamed_vector": False,
                  "query": {"kernel": True, "bias": False}}  # a per-head bias is a bias


def test_no_bias_of_a_model_is_decayed():
  from helpers import tiny_run
  from transformer.model import models
  from transformer.training import train_state
  config = tiny_run.tiny_config("unused", **{"model.use_bias": True, "model.scan_layers": True})
  names, shapes = train_state.abstract_params(models.make_model(config.model), config)
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): v for path, v in
          jax.tree_util.tree_leaves_with_path(optim.weight_decay_mask(names, shapes))}
  biases = [k for k in flat if k.endswith("/bias")]
  assert any("query" in k for k in biases) and not any(flat[k] for k in biases)
  assert any(flat[k] for k in flat if k.endswith("/kernel"))


@pytest.mark.parametrize("name", sorted(optim.OPTIMIZERS))
@pytest.mark.parametrize("lr", [0.1, 0.0])
def test_every_optimizer_decays_by_lr_times_rate(name, lr):
  """Decoupled decay, lr * wd * p a step, for every optimizer (optax's Adafactor adds its
  rate after the learning rate: 0.5 * p a step here, at any lr)."""
  params = {"kernel": jnp.ones((4, 4)), "scale": jnp.ones(4)}
  tx = optim.make_optimizer(_cfg(name=name, lr=lr, warmup_steps=0, schedule="constant",
                                 weight_decay=0.5, momentum=0.0), 10,
                            {"kernel": True, "scale": False})
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  np.testing.assert_allclose(updates["kernel"], -0.5 * lr * np.ones((4, 4)), atol=1e-7)
  np.testing.assert_allclose(updates["scale"], np.zeros(4), atol=1e-7)


def test_adamw_decays_only_masked_params():
  params = {"kernel": jnp.ones((2, 2)), "scale": jnp.ones(2)}
  mask = {"kernel": True, "scale": False}
  tx = optim.make_optimizer(_cfg(lr=0.1, warmup_steps=0, schedule="constant", weight_decay=0.5), 10,
                            mask)
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  np.testing.assert_allclose(updates["kernel"], -0.05 * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_allclose(updates["scale"], np.zeros(2))


def test_clipping_bounds_the_update_of_sgd():
  params = {"w": jnp.zeros(2)}
  tx = optim.make_optimizer(_cfg(name="sgd", momentum=0.0, lr=1.0, warmup_steps=0,
                                 schedule="constant", clip_norm=1.0, weight_decay=0.0), 10)
  updates, _ = tx.update({"w": jnp.array([30.0, 40.0])}, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], [-0.6, -0.8], rtol=1e-6)
  # clip_norm 0 is off (the config's "0 = off"), not a clip to nothing.
  tx = optim.make_optimizer(_cfg(name="sgd", momentum=0.0, lr=1.0, warmup_steps=0,
                                 schedule="constant", clip_norm=0.0, weight_decay=0.0), 10)
  updates, _ = tx.update({"w": jnp.array([30.0, 40.0])}, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], [-30.0, -40.0])
