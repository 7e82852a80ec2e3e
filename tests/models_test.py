"""Whole-model properties: causality by gradient, packing, scan/remat equivalence, precision,
padding, errors."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.schema import position_config
from transformer.model import models
from tests.helpers import tiny_models
from tests.helpers.tiny_models import tiny

pytestmark = pytest.mark.slow  # whole models compiled per case (conftest.py)

SCHEMES = ["none", "sinusoidal", "learned", "rope", "alibi", "t5_bias"]


def built(kind, scheme, **kw):
  cfg, model, params = tiny_models.built(kind, scheme, **kw)
  return cfg, model, {"params": params}


def tokens(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(4, 37, size=shape), jnp.int32)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_decoder_is_causal_by_gradient(scheme):
  """d logits[i] / d embedded[j] is zero for every j > i, and nonzero for j <= i."""
  cfg, model, variables = built("decoder", scheme)
  x = tokens((1, 10))
  _, perturb = model.apply(variables, x, mutable=["perturbations"])

  def logit_sum_at(i, perturbations):
    logits = model.apply({**variables, "perturbations": perturbations}, x)
    return jnp.sum(logits[0, i])

  for i in (0, 4, 9):
    g = jax.grad(functools.partial(logit_sum_at, i))(perturb["perturbations"])
    g = np.abs(np.asarray(jax.tree.leaves(g)[0][0])).sum(-1)
    assert np.all(g[i + 1:] == 0), (scheme, i, g)
    assert np.all(g[: i + 1] > 0), (scheme, i, g)


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_packed_documents_equal_separate_documents(kind, scheme):
  cfg, model, variables = built(kind, scheme)
  a, b = tokens((1, 5), 1), tokens((1, 7), 2)
  packed = jnp.concatenate([a, b, jnp.zeros((1, 3), jnp.int32)], axis=1)
  seg = jnp.asarray([[1] * 5 + [2] * 7 + [0] * 3])
  pos = jnp.asarray([list(range(5)) + list(range(7)) + [0] * 3])
  out = model.apply(variables, packed, segment_ids=seg, positions=pos)
  np.testing.assert_allclose(out[:, :5], model.apply(variables, a), atol=1e-5)
  np.testing.assert_allclose(out[:, 5:12], model.apply(variables, b), atol=1e-5)
  assert np.isfinite(np.asarray(out)).all()  # padding rows see nothing, yet no NaN


def test_packed_encoder_decoder_rows_equal_separate_examples():
  """The seq2seq pipeline packs examples: each packed pair (encoder and decoder segments with
  restarting positions) gives the logits of that example alone. One batch, one compile: row
  0 packs a and b, rows 1 and 2 hold a and b alone, right-padded (segment 0)."""
  cfg, model, variables = built("encoder_decoder", "rope")
  enc_a, enc_b, dec_a, dec_b = (np.asarray(tokens((1, n), seed))[0] for n, seed in
                                ((4, 5), (5, 6), (3, 7), (4, 8)))
  pad = lambda x, n: np.pad(x, (0, n - len(x)))
  seg = lambda *lengths: np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])
  enc = np.stack([np.concatenate([enc_a, enc_b]), pad(enc_a, 9), pad(enc_b, 9)])
  dec = np.stack([np.concatenate([dec_a, dec_b]), pad(dec_a, 7), pad(dec_b, 7)])
  out = model.apply(variables, jnp.asarray(enc), jnp.asarray(dec),
                    encoder_segment_ids=jnp.asarray([seg(4, 5), pad(seg(4), 9), pad(seg(5), 9)]),
                    decoder_segment_ids=jnp.asarray([seg(3, 4), pad(seg(3), 7), pad(seg(4), 7)]),
                    encoder_positions=jnp.asarray([list(range(4)) + list(range(5))] + [
                        list(range(9))] * 2),
                    decoder_positions=jnp.asarray([list(range(3)) + list(range(4))] + [
                        list(range(7))] * 2))
  np.testing.assert_allclose(out[0, :3], out[1, :3], atol=1e-5)
  np.testing.assert_allclose(out[0, 3:], out[2, :4], atol=1e-5)


def test_a_prefix_lm_decoder_sees_its_whole_prefix_and_not_the_future():
  """prefix_BL (a prefix LM, Raffel et al. 2020): prefix tokens attend to each other both
  ways; the rest stays causal."""
  cfg, model, variables = built("decoder", "rope")
  x = tokens((1, 6), 9)
  prefix = jnp.asarray([[True] * 4 + [False] * 2])
  out = model.apply(variables, x, prefix_BL=prefix)
  later_prefix = model.apply(variables, x.at[0, 3].set((x[0, 3] + 1) % cfg.vocab_size),
                             prefix_BL=prefix)
  assert np.abs(out[0, 0] - later_prefix[0, 0]).max() > 1e-5  # position 0 reads token 3
  last = model.apply(variables, x.at[0, 5].set((x[0, 5] + 1) % cfg.vocab_size), prefix_BL=prefix)
  np.testing.assert_allclose(out[0, :5], last[0, :5], atol=1e-6)  # nobody reads the future


def test_scaled_embeddings_are_the_table_times_sqrt_d_model():
  cfg = tiny("decoder", "none", scale_embeddings=True)
  embedder = models.Embedder(cfg)
  x = tokens((2, 3), 10)
  variables = embedder.init(jax.random.key(0), x)
  table = np.asarray(variables["params"]["embedding"].unbox())
  np.testing.assert_allclose(embedder.apply(variables, x), table[np.asarray(x)] *
                             np.sqrt(cfg.d_model), rtol=1e-6)


def test_attention_dropout_path_equals_the_implementations_at_a_vanishing_rate():
  """Attention dropout materializes the weights and groups the heads itself (8 query heads
  on 2 key/value heads, G = 4 != K): at a rate of 1e-7 it gives the deterministic output."""
  cfg, model, variables = built("decoder", "rope", num_heads=8, attention_dropout_rate=1e-7)
  x = tokens((2, 6), 12)
  want = model.apply(variables, x)
  got = model.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_scanned_layers_draw_their_own_dropout_masks():
  """Under nn.scan every layer must split the dropout rng (split_rngs): a shared key would
  drop the same units in every layer."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  cfg, model, variables = built("decoder", "rope", scan_layers=True, dropout_rate=0.5)

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, nn.Dropout) and context.method_name == "__call__":
      context.module.sow("intermediates", "kept", out != 0)
    return out

  with nn.intercept_methods(record):
    _, state = model.apply(variables, tokens((1, 8), 11), deterministic=False,
                           rngs={"dropout": jax.random.key(0)}, mutable=["intermediates"])
  masks = [np.asarray(m) for path, m in jax.tree_util.tree_leaves_with_path(state)
           if "ffn" in jax.tree_util.keystr(path)]
  assert masks and masks[0].shape[0] == cfg.num_layers == 2, [m.shape for m in masks]
  per_layer = masks[0].reshape(cfg.num_layers, -1)  # scan stacks the layers first
  assert (per_layer[0] != per_layer[1]).any()


@pytest.mark.parametrize("scheme", ["learned", "t5_bias", "rope"])
def test_encoder_decoder_cross_attention_respects_encoder_padding(scheme):
  cfg, model, variables = built("encoder_decoder", scheme)
  enc = tokens((2, 6), 3)
  dec = tokens((2, 5), 4)
  enc_seg = jnp.asarray([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
  out = model.apply(variables, enc, dec, encoder_segment_ids=enc_seg)
  changed_pad = enc.at[0, 4:].set(5)
  out2 = model.apply(variables, changed_pad, dec, encoder_segment_ids=enc_seg)
  np.testing.assert_allclose(out, out2, atol=1e-6)
  changed_real = enc.at[0, 1].set(17)
  out3 = model.apply(variables, changed_real, dec, encoder_segment_ids=enc_seg)
  assert np.abs(out[0] - out3[0]).max() > 1e-5  # the decoder reads the encoder
  # ... and its own future never: changing the last decoder token leaves earlier logits alone.
  out4 = model.apply(variables, enc, dec.at[:, -1].set(7), encoder_segment_ids=enc_seg)
  np.testing.assert_allclose(out[:, :-1], out4[:, :-1], atol=1e-6)


def _stack_layers(params, num_layers):
  """Unscanned params (layers_0, layers_1, ...) -> the scanned layout (layers, leading axis)."""
  def convert(tree):
    if not isinstance(tree, dict):
      return tree
    if "layers_0" in tree:
      rest = {k: v for k, v in tree.items() if not k.startswith("layers_")}
      layers = [tree[f"layers_{i}"] for i in range(num_layers)]
      rest["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
      return rest
    return {k: convert(v) for k, v in tree.items()}
  return convert(params)


@pytest.mark.parametrize("kind", ["decoder", "encoder_decoder"])
def test_scan_and_remat_give_the_same_outputs_and_gradients(kind):
  cfg, model, variables = built(kind, "alibi")
  params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                        variables["params"], is_leaf=lambda x: hasattr(x, "unbox"))
  args = (tokens((2, 9), 5),) * (2 if kind == "encoder_decoder" else 1)
  loss = lambda m, p: jnp.mean(m.apply({"params": p}, *args) ** 2)
  ref_out = model.apply({"params": params}, *args)
  ref_grad = jax.grad(functools.partial(loss, model))(params)
  for scan, remat in [(True, "none"), (False, "full"), (True, "dots")]:
    other = models.make_model(tiny(kind, "alibi", scan_layers=scan, remat=remat))
    p = _stack_layers(params, 2) if scan else params
    chex.assert_trees_all_close(other.apply({"params": p}, *args), ref_out, atol=1e-5)
    g = jax.grad(functools.partial(loss, other))(p)
    chex.assert_trees_all_close(g, _stack_layers(ref_grad, 2) if scan else ref_grad, atol=1e-5)


def test_bfloat16_compute_is_close_to_float32():
  cfg, model, variables = built("decoder", "rope")
  x = tokens((2, 12), 6)
  ref = model.apply(variables, x)
  bf16 = models.make_model(tiny("decoder", "rope", dtype="bfloat16"))
  out = bf16.apply(variables, x)
  assert out.dtype == jnp.float32  # logits come back in float32 for the loss
  np.testing.assert_allclose(out, ref, atol=0.05)
  probs_ref, probs = jax.nn.softmax(ref), jax.nn.softmax(out)
  assert float(jnp.max(jnp.abs(probs - probs_ref))) < 0.01


def test_params_carry_logical_axis_names():
  cfg, model, variables = built("encoder_decoder", "t5_bias")
  boxed = jax.tree.leaves(variables["params"], is_leaf=lambda x: hasattr(x, "names"))
  assert boxed and all(hasattr(x, "names") for x in boxed)
  names = {n for x in boxed for n in x.names}
  assert {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", "buckets"} <= names


def test_attention_weights_are_captured_per_layer_and_head():
  cfg, model, variables = built("decoder", "rope")
  x = tokens((1, 7))
  _, state = model.apply(variables, x, mutable=["intermediates"])
  inter = state["intermediates"]["tower"]["stack"]
  weights = [inter[f"layers_{i}"]["self_attention"]["attention_weights"][0] for i in range(2)]
  chex.assert_shape(weights, (1, 4, 7, 7))
  for w in weights:
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(np.asarray(w[0, 0]), 1) == 0)


@pytest.mark.parametrize("overrides,message", [
    (dict(d_model=30, num_heads=4), "not divisible"),
    (dict(num_heads=4, num_kv_heads=3), "not a multiple"),
    (dict(kind="seq2seq"), "valid: .*encoder_decoder"),
    (dict(attention="flash"), "valid: .*chunked"),
    (dict(ffn="swish"), "valid: .*swiglu"),
    (dict(norm="batchnorm"), "valid: .*rmsnorm"),
    (dict(cache_dtype="int8"), r"model.cache_dtype 'int8'; valid: .*bfloat16"),
    (dict(position=position_config("xpos")), "valid: .*alibi"),
    # Out of range: each used to fail deep in init, train on NaNs, or train on nothing.
    (dict(num_kv_heads=-1), r"model.num_kv_heads must be >= 0"),
    (dict(head_dim=-4), r"model.head_dim must be >= 0"),
    (dict(num_decoder_layers=-3), r"model.num_decoder_layers must be >= 0"),
    (dict(norm_eps=-1.0), r"model.norm_eps must be >= 0"),
    (dict(attention_chunk=0), r"model.attention_chunk must be positive"),
    (dict(dropout_rate=1.5), r"model.dropout_rate must be in \[0, 1\)"),
    (dict(attention_dropout_rate=1.0), r"model.attention_dropout_rate must be in \[0, 1\)"),
    (dict(position=position_config("rope", rotary_fraction=1.5)), "rotary_fraction must be in"),
    (dict(position=position_config("rope", theta=0.0)), "theta must be positive"),
    (dict(position=position_config("rope", scaling="linear", scaling_factor=0.0)),
     "scaling_factor >= 1"),
    (dict(position=position_config("rope", scaling="llama3", scaling_factor=8.0,
                                   low_freq_factor=4.0, high_freq_factor=1.0)),
     "low_freq_factor < high_freq_factor"),
    (dict(position=position_config("sinusoidal", max_wavelength=0.0)), "max_wavelength must"),
    (dict(position=position_config("t5_bias", num_buckets=0)), "num_buckets >= 4"),
    (dict(position=position_config("t5_bias", max_distance=0)), "max_distance > num_buckets"),
])
def test_bad_configs_raise_clear_errors(overrides, message):
  with pytest.raises(ValueError, match=message):
    models.make_model(tiny(**overrides))


def test_sequence_longer_than_learned_table_is_refused():
  cfg, model, variables = built("decoder", "learned")
  with pytest.raises(ValueError, match="exceeds the learned position table"):
    model.apply(variables, tokens((1, 40)))
