"""Optimizers and learning-rate schedules, built from `config.opt` through two registries.

`make_optimizer(opt_config, total_steps, decay_mask)` returns one optax transformation:
global-norm clipping, then the named optimizer driven by the named schedule. Gradient
accumulation is not an optax wrapper here: the train step splits the batch into
`opt.grad_accum_steps` micro-batches and sums their gradients before one update, which gives
exactly the large-batch gradient (optax.MultiSteps would also work, but it keeps an extra copy
of the gradients in the optimizer state and makes "one step" mean different things in
different places).
"""

import math
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax


def _warmup(step, warmup_steps):
  # Ramp from lr/warmup on the first update rather than from 0, so step 0 is never wasted.
  return jnp.minimum(1.0, (step + 1.0) / jnp.maximum(warmup_steps, 1))


def _cosine(cfg, total_steps):
  def schedule(step):
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    progress = jnp.clip((step - cfg.warmup_steps) / decay_steps, 0.0, 1.0)
    cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    floor = cfg.min_lr_ratio
    return cfg.lr * _warmup(step, cfg.warmup_steps) * (floor + (1.0 - floor) * cosine)
  return schedule


def _linear(cfg, total_steps):
  def schedule(step):
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    progress = jnp.clip((step - cfg.warmup_steps) / decay_steps, 0.0, 1.0)
    floor = cfg.min_lr_ratio
    return cfg.lr * _warmup(step, cfg.warmup_steps) * (1.0 - (1.0 - floor) * progress)
  return schedule


def _rsqrt(cfg, total_steps):
  del total_steps  # inverse square root never ends; that is its point
  def schedule(step):
    # Continuous at the end of warmup: lr * sqrt(warmup / step) for step >= warmup.
    decay = jnp.sqrt(jnp.maximum(cfg.warmup_steps, 1) / jnp.maximum(step + 1.0, cfg.warmup_steps))
    return cfg.lr * _warmup(step, cfg.warmup_steps) * decay
  return schedule


def _constant(cfg, total_steps):
  del total_steps
  return lambda step: cfg.lr * _warmup(step, cfg.warmup_steps)


def _wsd(cfg, total_steps):
  """Warmup-stable-decay: flat after warmup, then a linear cool-down over the last steps.

  The cool-down is the last `decay_fraction` of training, so a run can be branched from any
  stable-phase checkpoint and cooled down for a different budget (Hägele et al. 2024).
  """
  def schedule(step):
    decay_steps = max(int(round(cfg.decay_fraction * total_steps)), 1)
    decay_start = total_steps - decay_steps
    progress = jnp.clip((step - decay_start) / decay_steps, 0.0, 1.0)
    floor = cfg.min_lr_ratio
    return cfg.lr * _warmup(step, cfg.warmup_steps) * (1.0 - (1.0 - floor) * progress)
  return schedule


SCHEDULES: dict[str, Callable] = {
    "cosine": _cosine,
    "linear": _linear,
    "rsqrt": _rsqrt,
    "constant": _constant,
    "wsd": _wsd,
}


def _adamw(cfg, lr, decay_mask):
  return optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                     weight_decay=cfg.weight_decay, mask=decay_mask)


def _adafactor(cfg, lr, decay_mask):
  # momentum=b1 only when asked for: the memory saving is Adafactor's reason to exist.
  # optax adds its weight_decay_rate * p after the learning rate, so a rate of 0.1 would
  # shrink every matrix by 10% a step; without a rate there, the chain returns -u, decay makes
  # it -(u + wd p) and the schedule scales both, as adamw, lion and sgd decay (lr * wd * p).
  return optax.chain(
      optax.adafactor(None, momentum=cfg.b1 if cfg.adafactor_momentum else None,
                      multiply_by_parameter_scale=False),
      optax.add_decayed_weights(-cfg.weight_decay, mask=decay_mask),
      optax.scale_by_schedule(lr))


def _lion(cfg, lr, decay_mask):
  return optax.lion(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask)


def _sgd(cfg, lr, decay_mask):
  # Decay first, then momentum: the classic "L2 through the gradient" SGD recipe.
  return optax.chain(
      optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask),
      optax.sgd(lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov))


OPTIMIZERS: dict[str, Callable] = {
    "adamw": _adamw,
    "adafactor": _adafactor,
    "lion": _lion,
    "sgd": _sgd,
}


def check_config(opt_config: ml_collections.ConfigDict) -> None:
  """One-line errors for bad names and numbers, before anything is compiled."""
  if opt_config.name not in OPTIMIZERS:
    raise ValueError(f"unknown opt.name {opt_config.name!r}; valid: {sorted(OPTIMIZERS)}")
  if opt_config.schedule not in SCHEDULES:
    raise ValueError(f"unknown opt.schedule {opt_config.schedule!r}; valid: {sorted(SCHEDULES)}")
  if opt_config.grad_accum_steps < 1:
    raise ValueError(f"opt.grad_accum_steps must be >= 1, got {opt_config.grad_accum_steps}")
  if not 0.0 <= opt_config.decay_fraction <= 1.0:
    raise ValueError(f"opt.decay_fraction must be in [0, 1], got {opt_config.decay_fraction}")
  # A negative rate climbs the loss and a NaN one poisons the first update; both would
  # otherwise train (or crash) only after the compile.
  if not (math.isfinite(opt_config.lr) and opt_config.lr >= 0):
    raise ValueError(f"opt.lr must be a finite number >= 0, got {opt_config.lr}")
  if opt_config.warmup_steps < 0:
    raise ValueError(f"opt.warmup_steps must be >= 0, got {opt_config.warmup_steps}")
  # Moment decays outside [0, 1) make the averages grow without bound; the rest are signs.
  for key in ("b1", "b2", "momentum"):
    if not 0.0 <= opt_config[key] < 1.0:
      raise ValueError(f"opt.{key} must be in [0, 1), got {opt_config[key]}")
  for key in ("eps", "weight_decay", "clip_norm"):
    if not opt_config[key] >= 0:
      raise ValueError(f"opt.{key} must be >= 0, got {opt_config[key]}")
  if not 0.0 <= opt_config.min_lr_ratio <= 1.0:
    raise ValueError(f"opt.min_lr_ratio must be in [0, 1], got {opt_config.min_lr_ratio}")


def make_schedule(opt_config, total_steps: int) -> Callable:
  check_config(opt_config)
  return SCHEDULES[opt_config.schedule](opt_config, total_steps)


def make_optimizer(opt_config, total_steps: int, decay_mask=None) -> optax.GradientTransformation:
  """Clipping, then the optimizer at the scheduled rate. `decay_mask`: pytree of bools."""
  schedule = make_schedule(opt_config, total_steps)
  parts = []
  if opt_config.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt_config.clip_norm))
  parts.append(OPTIMIZERS[opt_config.name](opt_config, schedule, decay_mask))
  return optax.chain(*parts)


def weight_decay_mask(logical_names, params):
  """True for matrices, False for norm scales, biases and other vectors.

  Decided by the logical axis names every parameter carries, not by ndim, because a scanned
  layer stack turns a norm scale of shape [embed] into [layers, embed]. A parameter without
  names (not created through nn.with_logical_partitioning) falls back to ndim >= 2. A
  parameter named `bias` is never decayed, whatever its names: attention's per-head biases
  are [heads, head_dim].
  """
  def is_matrix(path, names, param):
    if getattr(path[-1], "key", None) == "bias":
      return False
    if not names:
      return param.ndim >= 2
    return len([n for n in names if n != "layers"]) >= 2
  return jax.tree_util.tree_map_with_path(is_matrix, logical_names, params,
                                          is_leaf=lambda x: isinstance(x, tuple))
