"""Positional schemes behind one registry, each acting through the same three hooks.

A scheme can tell the model where a token is in three places:
  1. add a vector to the token embeddings        (`sinusoidal`, `learned`)
  2. rotate queries and keys before scoring      (`rope`)
  3. add a bias to the attention scores          (`alibi`, `t5_bias`)
Every scheme is a Linen module with `embed(x_BLD, positions_BL)` and `attention_terms(causal)`;
the defaults are the identity, so attention code never asks which scheme it is running.
`attention_terms` returns an `AttentionTerms` pytree that attention implementations apply to
whatever block of queries and keys they are working on (so chunked attention never builds a
full L x S bias).

Cross-attention uses no positional terms: queries and keys come from different sequences, so
their offset means nothing. Schemes that act on embeddings still position both sequences.
"""

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct


# ---------------------------------------------------------------------------------------------
# Score biases (hook 3). Each takes (table, q_pos_BL, k_pos_BS, static settings) -> bias_BNLS.

def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al. 2022: a geometric sequence starting at 2^(-8/n) with that same ratio.

  For head counts that are not a power of two, the paper's code takes the slopes of the
  nearest lower power of two and interleaves every other slope of the next power of two.
  """
  def power_of_two(n):
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]

  if math.log2(num_heads).is_integer():
    return np.asarray(power_of_two(num_heads), np.float32)
  closest = 2 ** math.floor(math.log2(num_heads))
  extra = power_of_two(2 * closest)[0::2][: num_heads - closest]
  return np.asarray(power_of_two(closest) + extra, np.float32)


def _alibi_bias(slopes_N, q_pos_BL, k_pos_BS, settings):
  del settings
  # |i - j| makes the same bias work in encoders; in decoders the causal mask removes j > i.
  distance_BLS = jnp.abs(q_pos_BL[:, :, None] - k_pos_BS[:, None, :]).astype(jnp.float32)
  return -slopes_N[None, :, None, None] * distance_BLS[:, None, :, :]


def t5_relative_bucket(relative_position, bidirectional: bool, num_buckets: int,
                       max_distance: int):
  """The published T5 bucketing (Raffel et al. 2020, mesh_tensorflow): exact buckets for small
  offsets, logarithmic ones up to max_distance, everything beyond shares the last bucket.
  relative_position = key position - query position."""
  n = -relative_position
  bucket = jnp.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket += (n < 0).astype(n.dtype) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  # Clamp before the log so that n = 0 (handled by is_small) does not produce -inf.
  log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(
      max_distance / max_exact)
  large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(n.dtype)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(is_small, n, large)


def _t5_bias(table_TN, q_pos_BL, k_pos_BS, settings):
  bidirectional, num_buckets, max_distance = settings
  relative_BLS = k_pos_BS[:, None, :] - q_pos_BL[:, :, None]
  bucket_BLS = t5_relative_bucket(relative_BLS, bidirectional, num_buckets, max_distance)
  bias_BLSN = jnp.take(table_TN, bucket_BLS, axis=0)
  return jnp.transpose(bias_BLSN, (0, 3, 1, 2)).astype(jnp.float32)


BIASES: dict[str, Callable] = {"alibi": _alibi_bias, "t5": _t5_bias}


@struct.dataclass
class AttentionTerms:
  """What a positional scheme contributes inside attention, for any block of queries and keys.

  Empty by default: no rotation, no bias. Static fields keep the scheme's settings out of the
  traced values so a scanned stack can broadcast this object to every layer.
  """
  inv_freq_F: jax.Array | None = None  # RoPE angular speed of each rotated pair
  rope_factor: float = struct.field(pytree_node=False, default=1.0)  # YaRN's cos/sin scale
  rot_dim: int = struct.field(pytree_node=False, default=0)
  bias_table: jax.Array | None = None  # ALiBi slopes_N or the T5 table_TN
  bias_kind: str = struct.field(pytree_node=False, default="")
  bias_settings: tuple = struct.field(pytree_node=False, default=())

  def rotate(self, x_BLNH: jax.Array, pos_BL: jax.Array) -> jax.Array:
    """Rotate pairs (i, i + rot_dim/2) of the first rot_dim features (GPT-NeoX / HF layout)."""
    if self.inv_freq_F is None:
      return x_BLNH
    angles_BLF = pos_BL[..., None].astype(jnp.float32) * self.inv_freq_F
    cos = (jnp.cos(angles_BLF) * self.rope_factor)[:, :, None, :]
    sin = (jnp.sin(angles_BLF) * self.rope_factor)[:, :, None, :]
    rot, rest = x_BLNH[..., : self.rot_dim], x_BLNH[..., self.rot_dim:]
    x1, x2 = jnp.split(rot.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return jnp.concatenate([rotated.astype(x_BLNH.dtype), rest], axis=-1)

  def bias(self, q_pos_BL: jax.Array, k_pos_BS: jax.Array) -> jax.Array | None:
    if self.bias_table is None:
      return None
    return BIASES[self.bias_kind](self.bias_table, q_pos_BL, k_pos_BS, self.bias_settings)


# ---------------------------------------------------------------------------------------------
# RoPE frequencies and context-extension scalings.

def _rope_none(inv_freq, cfg, rot_dim):
  return inv_freq, 1.0


def _rope_linear(inv_freq, cfg, rot_dim):
  # Position interpolation (Chen et al. 2023): squeeze positions by the factor.
  return inv_freq / cfg.scaling_factor, 1.0


def _rope_ntk(inv_freq, cfg, rot_dim):
  # NTK-aware scaling (bloc97, 2023): stretch the base so the slowest pair is interpolated
  # and the fastest is left alone.
  theta = cfg.theta * cfg.scaling_factor ** (rot_dim / (rot_dim - 2))
  return 1.0 / theta ** (np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim), 1.0


def _rope_yarn(inv_freq, cfg, rot_dim):
  # YaRN (Peng et al. 2023), as in the reference implementation: interpolate pairs that turn
  # fewer than beta_slow times over the original context, keep those turning more than
  # beta_fast times, ramp linearly between; scale cos/sin by 0.1 ln(s) + 1.
  factor, original = cfg.scaling_factor, cfg.original_max_len

  def correction_dim(rotations):
    return rot_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(cfg.theta))

  low = max(math.floor(correction_dim(cfg.beta_fast)), 0)
  high = min(math.ceil(correction_dim(cfg.beta_slow)), rot_dim - 1)
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(rot_dim // 2) - low) / (high - low), 0, 1)
  keep = 1 - ramp  # 1: extrapolate (leave the frequency), 0: interpolate (divide by factor)
  inv = inv_freq / factor * (1 - keep) + inv_freq * keep
  return inv, 0.1 * math.log(factor) + 1.0


def _rope_llama3(inv_freq, cfg, rot_dim):
  # Llama 3.1: wavelengths longer than original/low_freq_factor are divided by the factor,
  # shorter than original/high_freq_factor kept, smooth blend in between.
  factor, original = cfg.scaling_factor, cfg.original_max_len
  low_wavelen = original / cfg.low_freq_factor
  high_wavelen = original / cfg.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
  smooth = (original / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor -
                                                         cfg.low_freq_factor)
  blended = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, blended, scaled), 1.0


ROPE_SCALINGS = {"none": _rope_none, "linear": _rope_linear, "ntk": _rope_ntk,
                 "yarn": _rope_yarn, "llama3": _rope_llama3}


def rope_frequencies(pos_cfg: ml_collections.ConfigDict, head_dim: int, max_len: int):
  """(inv_freq_F, cos/sin factor, rotated dims) for a RoPE config; numpy, computed once."""
  rot_dim = int(head_dim * pos_cfg.rotary_fraction) // 2 * 2
  if rot_dim < 2:
    raise ValueError(f"rope rotates no features: head_dim={head_dim} x rotary_fraction="
                     f"{pos_cfg.rotary_fraction} < 2; raise model.position.rotary_fraction.")
  if pos_cfg.scaling not in ROPE_SCALINGS:
    raise ValueError(f"Unknown model.position.scaling {pos_cfg.scaling!r}; valid: "
                     f"{sorted(ROPE_SCALINGS)}.")
  cfg = ml_collections.ConfigDict(pos_cfg.to_dict())
  if not cfg.original_max_len:
    cfg.original_max_len = max_len
  inv_freq = 1.0 / pos_cfg.theta ** (np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
  inv_freq, factor = ROPE_SCALINGS[pos_cfg.scaling](inv_freq, cfg, rot_dim)
  return np.asarray(inv_freq, np.float32), float(factor), rot_dim


def sinusoidal_table(positions, d_model: int, max_wavelength: float = 10_000.0):
  """The paper's formula: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(same)."""
  i = jnp.arange(d_model // 2, dtype=jnp.float32)
  angles = positions[..., None].astype(jnp.float32) / max_wavelength ** (2 * i / d_model)
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  return pe.reshape(*positions.shape, d_model)


# ---------------------------------------------------------------------------------------------
# The schemes.

class NoPositions(nn.Module):
  """NoPE: the identity for every hook. Also the base class giving the defaults."""
  cfg: ml_collections.ConfigDict

  # Longest sequence the scheme can position; learned tables override it.
  def max_length(self) -> float:
    return math.inf

  def embed(self, x_BLD, positions_BL):
    return x_BLD

  def attention_terms(self, causal: bool) -> AttentionTerms:
    return AttentionTerms()


class Sinusoidal(NoPositions):

  def embed(self, x_BLD, positions_BL):
    pe = sinusoidal_table(positions_BL, x_BLD.shape[-1], self.cfg.position.max_wavelength)
    return x_BLD + pe.astype(x_BLD.dtype)


class Learned(NoPositions):

  def max_length(self):
    return self.cfg.max_len

  @nn.compact
  def embed(self, x_BLD, positions_BL):
    if x_BLD.shape[1] > self.cfg.max_len:
      raise ValueError(f"Sequence length {x_BLD.shape[1]} exceeds the learned position table "
                       f"(model.max_len={self.cfg.max_len}); raise max_len or use a relative "
                       f"scheme (rope, alibi, t5_bias).")
    table = self.param(
        "pos_embedding",
        nn.with_logical_partitioning(nn.initializers.normal(0.02), ("length", "embed")),
        (self.cfg.max_len, self.cfg.d_model), jnp.dtype(self.cfg.param_dtype))
    return x_BLD + jnp.take(table, positions_BL, axis=0).astype(x_BLD.dtype)


class Rope(NoPositions):

  def attention_terms(self, causal):
    head_dim = self.cfg.head_dim or self.cfg.d_model // self.cfg.num_heads
    inv_freq, factor, rot_dim = rope_frequencies(self.cfg.position, head_dim, self.cfg.max_len)
    return AttentionTerms(inv_freq_F=jnp.asarray(inv_freq), rope_factor=factor, rot_dim=rot_dim)


class Alibi(NoPositions):

  def attention_terms(self, causal):
    return AttentionTerms(bias_table=jnp.asarray(alibi_slopes(self.cfg.num_heads)),
                          bias_kind="alibi")


class T5Bias(NoPositions):
  """One learned scalar per (bucket, head), shared by every layer of a stack, as in T5."""

  @nn.compact
  def attention_terms(self, causal):
    pos = self.cfg.position
    table = self.param(
        "rel_bias",
        nn.with_logical_partitioning(nn.initializers.normal(0.02), ("buckets", "heads")),
        (pos.num_buckets, self.cfg.num_heads), jnp.dtype(self.cfg.param_dtype))
    return AttentionTerms(bias_table=table, bias_kind="t5",
                          bias_settings=(not causal, pos.num_buckets, pos.max_distance))


SCHEMES = {"none": NoPositions, "sinusoidal": Sinusoidal, "learned": Learned, "rope": Rope,
           "alibi": Alibi, "t5_bias": T5Bias}


def make_scheme(cfg: ml_collections.ConfigDict, name: str | None = None) -> NoPositions:
  """The positional scheme module for a model config (`name` only for Linen scoping)."""
  scheme = cfg.position.name
  if scheme not in SCHEMES:
    raise ValueError(f"Unknown model.position.name {scheme!r}; valid: {sorted(SCHEMES)}.")
  return SCHEMES[scheme](cfg, name=name)
