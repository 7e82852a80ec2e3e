"""Norms, feed-forward variants and the residual block.

The residual stream x_BLD is edited, never replaced: each sub-layer reads a normalized copy
(pre-norm) or normalizes the sum afterwards (post-norm, the 2017 block), and adds its change.
Norms compute in float32 whatever the compute dtype, because bf16 variance sums lose the
small differences they exist to remove.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from transformer.model.attention import Attention, Layout
from transformer.model.dense import Dense, constrain
from transformer.model.positions import AttentionTerms


def _norm_param(init):
  return nn.with_logical_partitioning(init, ("embed",))


NORMS = {
    # E[x^2] - E[x]^2 (the fast variance) cancels badly for GPT-2-sized activations.
    "layernorm": lambda cfg, name: nn.LayerNorm(
        epsilon=cfg.norm_eps, dtype=jnp.float32, param_dtype=jnp.dtype(cfg.param_dtype),
        use_fast_variance=False,
        scale_init=_norm_param(nn.initializers.ones),
        bias_init=_norm_param(nn.initializers.zeros), name=name),
    "rmsnorm": lambda cfg, name: nn.RMSNorm(
        epsilon=cfg.norm_eps, dtype=jnp.float32, param_dtype=jnp.dtype(cfg.param_dtype),
        scale_init=_norm_param(nn.initializers.ones), name=name),
}


def make_norm(cfg: ml_collections.ConfigDict, name: str):
  if cfg.norm not in NORMS:
    raise ValueError(f"Unknown model.norm {cfg.norm!r}; valid: {sorted(NORMS)}.")
  return NORMS[cfg.norm](cfg, name)


class Norm(nn.Module):
  """A norm in float32 that hands back the compute dtype."""
  cfg: ml_collections.ConfigDict

  @nn.compact
  def __call__(self, x):
    return make_norm(self.cfg, "norm")(x.astype(jnp.float32)).astype(jnp.dtype(self.cfg.dtype))


def gelu(x):
  """Exact GELU in its erf form, x/2 (1 + erf(x / sqrt 2)), as PyTorch computes it.

  jax.nn.gelu(approximate=False) uses erfc, which keeps relative accuracy where GELU
  underflows (x < -5) but which XLA:CPU evaluates at several times erf's cost (figures in
  docs/performance.md). The two differ by at most ~1e-6 in absolute value."""
  return 0.5 * x * (1 + jax.lax.erf(x * 0.7071067811865476))


# name -> (activation, gated). Gated variants (Shazeer 2020) multiply act(x W0) by x W1.
# geglu uses the tanh approximation of GELU, as T5 v1.1's "gated-gelu" does.
FFNS = {
    "relu": (jax.nn.relu, False),
    "gelu": (gelu, False),
    "gelu_tanh": (functools.partial(jax.nn.gelu, approximate=True), False),
    "swiglu": (jax.nn.silu, True),
    "geglu": (functools.partial(jax.nn.gelu, approximate=True), True),
}


class FeedForward(nn.Module):
  cfg: ml_collections.ConfigDict
  deterministic: bool = True

  @nn.compact
  def __call__(self, x_BLD):
    cfg = self.cfg
    if cfg.ffn not in FFNS:
      raise ValueError(f"Unknown model.ffn {cfg.ffn!r}; valid: {sorted(FFNS)}.")
    act, gated = FFNS[cfg.ffn]
    up = lambda name: Dense(cfg.d_ff, ("embed", "mlp"), cfg=cfg, name=name)(x_BLD)
    if gated:
      h_BLF = act(up("wi_0")) * up("wi_1")
    else:
      h_BLF = act(up("wi"))
    h_BLF = constrain(h_BLF, ("batch", "length", "mlp"))
    h_BLF = nn.Dropout(cfg.dropout_rate)(h_BLF, deterministic=self.deterministic)
    return Dense(cfg.d_model, ("mlp", "embed"), cfg=cfg, name="wo")(h_BLF)


class Block(nn.Module):
  """Self-attention, optional cross-attention, feed-forward; each a residual edit.

  Signature fits nn.scan: (carry, *broadcast) -> (carry, None).
  """
  cfg: ml_collections.ConfigDict
  cross: bool = False
  deterministic: bool = True
  cache_mode: str = ""  # see Attention

  @nn.compact
  def __call__(self, x_BLD, layout: Layout, terms: AttentionTerms, enc_BSD=None,
               cross_layout: Layout | None = None):
    cfg = self.cfg
    pre = cfg.norm_position == "pre"
    drop = nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)

    def residual(name, fn, x):
      if pre:
        return x + drop(fn(Norm(cfg, name=f"{name}_norm")(x)))
      return Norm(cfg, name=f"{name}_norm")(x + drop(fn(x)))

    attend = Attention(cfg, self.deterministic, self.cache_mode, name="self_attention")
    x_BLD = residual("self_attention", lambda h: attend(h, layout, terms), x_BLD)
    if self.cross:
      cross = Attention(cfg, self.deterministic, self.cache_mode, name="cross_attention")
      # Cross-attention has no positional terms: the offset between a decoder and an
      # encoder position carries no meaning.
      x_BLD = residual("cross_attention",
                       lambda h: cross(h, cross_layout, AttentionTerms(), kv_BSD=enc_BSD), x_BLD)
    x_BLD = residual("ffn", FeedForward(cfg, self.deterministic, name="ffn"), x_BLD)
    # The residual stream is split by position over the tensor axis (sequence parallelism,
    # Korthikanti et al. 2022): norms, dropout and the residual sums are per token, and a
    # whole [B, L, D] copy on every tensor device would be most of the step's activations.
    x_BLD = constrain(x_BLD, ("batch", "residual_length", "embed"))
    return x_BLD, None


REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Stack(nn.Module):
  """num_layers Blocks, unrolled or under nn.scan (one compiled layer, params stacked on a
  leading 'layers' axis), optionally rematerialized."""
  cfg: ml_collections.ConfigDict
  num_layers: int
  cross: bool = False
  deterministic: bool = True
  cache_mode: str = ""  # see Attention

  @nn.compact
  def __call__(self, x_BLD, layout, terms, enc_BSD=None, cross_layout=None):
    cfg = self.cfg
    if cfg.remat not in REMAT_POLICIES:
      raise ValueError(f"Unknown model.remat {cfg.remat!r}; valid: {sorted(REMAT_POLICIES)}.")
    block = Block
    # Decoding takes no gradients: nothing to rematerialize.
    if cfg.remat != "none" and not self.cache_mode:
      block = nn.remat(Block, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
      scanned = nn.scan(
          block, variable_axes={"params": 0, "intermediates": 0, "cache": 0},
          split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
          length=self.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
      x_BLD, _ = scanned(cfg, self.cross, self.deterministic, self.cache_mode, name="layers")(
          x_BLD, layout, terms, enc_BSD, cross_layout)
      return x_BLD
    for i in range(self.num_layers):
      x_BLD, _ = block(cfg, self.cross, self.deterministic, self.cache_mode,
                       name=f"layers_{i}")(
          x_BLD, layout, terms, enc_BSD, cross_layout)
    return x_BLD
