"""Tiny models the tests share: the model and decoding tests' GQA model (`tiny`, `built`:
tests/models_test.py, decode_test.py), and model configs of ours that each Hugging Face family
can write with random parameters of their shapes (`ours`, `init_params`: the conversion tests)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import meta

from transformer.model import models
from transformer.schema import model_config, position_config


def tiny(kind="decoder", scheme="rope", **kw):
  """GQA (4 query heads, 2 kv heads), so a KV cache is smaller than the heads; dense attention."""
  base = dict(kind=kind, vocab_size=37, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
              d_ff=48, max_len=32, position=position_config(scheme), attention="dense")
  base.update(kw)
  return model_config(**base)


@functools.lru_cache(maxsize=None)
def built(kind="decoder", scheme="rope", **kw):
  """`tiny`'s config, model and initialized parameters (cached: the tests share one init)."""
  cfg = tiny(kind, scheme, **kw)
  model = models.make_model(cfg)
  params = model.init(jax.random.key(0), *models.dummy_inputs(cfg, 1, 8))["params"]
  return cfg, model, params


def ours(family, **overrides):
  """A tiny model config of ours that `family` can write."""
  base = dict(vocab_size=40, d_model=16, num_layers=2, num_heads=4, d_ff=24, max_len=32)
  per_family = {
      "gpt2": dict(kind="decoder", position=position_config("learned"), norm="layernorm",
                   ffn="gelu_tanh", use_bias=True, norm_eps=1e-5),
      "llama": dict(kind="decoder", position=position_config(
                        "rope", scaling="yarn", scaling_factor=4.0, original_max_len=16),
                    num_kv_heads=2, ffn="swiglu", tie_embeddings=False, norm_eps=1e-5),
      "bert": dict(kind="encoder", position=position_config("learned"), norm="layernorm",
                   norm_position="post", use_bias=True, embed_norm=True, num_token_types=2,
                   mlm_transform=True, head_bias=True, pooler=True, norm_eps=1e-12),
      "t5": dict(kind="encoder_decoder", position=position_config("t5_bias"), ffn="geglu",
                 head_dim=8, qk_scale=1.0, tie_embeddings=False, num_decoder_layers=1),
  }
  return model_config(**{**base, **per_family[family], **overrides})


def init_params(cfg, seed=0):
  """Random parameters of the model's shapes, without compiling its init."""
  model = models.make_model(cfg)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), *models.dummy_inputs(cfg)))
  rng = np.random.RandomState(seed)
  return {"params": jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype),
                                 meta.unbox(shapes)["params"])}
