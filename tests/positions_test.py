"""Positional schemes against their papers' formulas and defining properties."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.schema import model_config, position_config
from transformer.model import attention, positions


def test_sinusoidal_matches_the_paper_formula():
  d = 16
  pos = np.arange(50)
  table = np.asarray(positions.sinusoidal_table(jnp.asarray(pos), d))
  for p in (0, 1, 7, 49):
    for i in range(d // 2):
      angle = p / 10000 ** (2 * i / d)
      assert table[p, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
      assert table[p, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_offset_is_a_fixed_linear_map():
  """PE(p + k) = M_k PE(p) with M_k a block rotation that depends on k only."""
  d, k = 16, 5
  table = np.asarray(positions.sinusoidal_table(jnp.arange(64), d), np.float64)
  freqs = 1.0 / 10000 ** (2 * np.arange(d // 2) / d)
  m = np.zeros((d, d))
  for i, w in enumerate(freqs):
    c, s = math.cos(w * k), math.sin(w * k)
    # [sin(a+b), cos(a+b)] = [[c, s], [-s, c]] [sin a, cos a]
    m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, s], [-s, c]]
  for p in (0, 3, 20, 50):
    np.testing.assert_allclose(m @ table[p], table[p + k], atol=1e-4)


def _rope_terms(**kw):
  cfg = model_config(d_model=32, num_heads=2, position=position_config("rope", **kw))
  return positions.Rope(cfg).apply({}, False, method="attention_terms")


def test_rope_scores_depend_only_on_the_offset():
  terms = _rope_terms()
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32)
  score = lambda i, j: float(jnp.sum(terms.rotate(q, jnp.array([[i]])) *
                                     terms.rotate(k, jnp.array([[j]]))))
  for offset in (0, 1, 5, 100):
    ref = score(offset, 0)
    for start in (3, 40, 1000):
      assert score(start + offset, start) == pytest.approx(ref, rel=1e-4, abs=1e-4)
  assert score(5, 0) != pytest.approx(score(6, 0), abs=1e-3)


class RopeRotationTest(chex.TestCase):
  """The rotation behaves the same jitted and not (chex variants)."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_preserves_norms_and_partial_rotation_keeps_the_rest(self):
    terms = _rope_terms(rotary_fraction=0.5)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(1, 4, 2, 16)), jnp.float32)
    y = self.variant(terms.rotate)(x, jnp.arange(4)[None] * 7)
    chex.assert_shape(y, x.shape)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1),
                               rtol=1e-5)
    np.testing.assert_array_equal(y[..., 8:], x[..., 8:])


def test_llama3_rope_speeds_from_the_seed():
  """A Llama 3 head: 64 pairs from ~57 degrees per token to one turn per ~2.5M tokens."""
  pos = position_config("rope", theta=500_000.0)
  inv_freq, _, rot = positions.rope_frequencies(pos, 128, 8192)
  assert rot == 128 and len(inv_freq) == 64
  assert math.degrees(inv_freq[0]) == pytest.approx(57.3, abs=0.1)
  assert 2 * math.pi / inv_freq[-1] == pytest.approx(2.5e6, rel=0.1)


def test_rope_scalings_against_independent_formulas():
  base = position_config("rope", theta=10_000.0)
  inv, _, _ = positions.rope_frequencies(base, 64, 1024)
  lin, _, _ = positions.rope_frequencies(
      position_config("rope", scaling="linear", scaling_factor=4.0), 64, 1024)
  np.testing.assert_allclose(lin, inv / 4, rtol=1e-6)
  ntk, _, _ = positions.rope_frequencies(
      position_config("rope", scaling="ntk", scaling_factor=4.0), 64, 1024)
  assert ntk[0] == pytest.approx(inv[0]) and ntk[-1] == pytest.approx(inv[-1] / 4, rel=1e-4)

  # Llama 3.1, written as Meta's reference loop over frequencies.
  cfg = position_config("rope", theta=500_000.0, scaling="llama3", scaling_factor=8.0,
                         original_max_len=8192, low_freq_factor=1.0, high_freq_factor=4.0)
  got, _, _ = positions.rope_frequencies(cfg, 128, 131072)
  ref_base = 1.0 / 500_000.0 ** (np.arange(0, 128, 2) / 128)
  expected = []
  for f in ref_base:
    wavelen = 2 * math.pi / f
    if wavelen < 8192 / 4.0:
      expected.append(f)
    elif wavelen > 8192 / 1.0:
      expected.append(f / 8.0)
    else:
      smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
      expected.append((1 - smooth) * f / 8.0 + smooth * f)
  np.testing.assert_allclose(got, expected, rtol=1e-5)

  # YaRN: fast pairs untouched, slow pairs interpolated, cos/sin scaled by 0.1 ln s + 1.
  yarn, factor, _ = positions.rope_frequencies(
      position_config("rope", scaling="yarn", scaling_factor=4.0, original_max_len=256),
      64, 1024)
  assert factor == pytest.approx(0.1 * math.log(4.0) + 1.0)
  assert yarn[0] == pytest.approx(inv[0])
  assert yarn[-1] == pytest.approx(inv[-1] / 4, rel=1e-5)
  assert np.all(np.diff(inv / yarn) >= -1e-6)  # interpolation grows monotonically


def _yarn_reference(dim, base, scale, original, beta_fast=32.0, beta_slow=1.0):
  """inv_freq of Peng et al.'s reference YaRN (find_correction_range, linear_ramp_mask)."""
  def correction_dim(rotations):
    return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))
  low = max(math.floor(correction_dim(beta_fast)), 0)
  high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
  extrapolation = [base ** (-2 * i / dim) for i in range(dim // 2)]
  out = []
  for i, f in enumerate(extrapolation):
    extrapolate = 1 - min(max((i - low) / ((high - low) or 0.001), 0.0), 1.0)
    out.append(f / scale * (1 - extrapolate) + f * extrapolate)
  return out


def test_every_yarn_and_partial_rope_frequency_matches_its_formula():
  yarn, _, _ = positions.rope_frequencies(
      position_config("rope", scaling="yarn", scaling_factor=4.0, original_max_len=256), 64, 1024)
  np.testing.assert_allclose(yarn, _yarn_reference(64, 10000.0, 4.0, 256), rtol=1e-6)
  # Partial rotation: the frequencies span the rotated dims, theta^(-2i / rot_dim).
  inv, _, rot = positions.rope_frequencies(position_config("rope", rotary_fraction=0.5), 64, 128)
  assert rot == 32
  np.testing.assert_allclose(inv, 10000.0 ** (-np.arange(0, 32, 2) / 32), rtol=1e-6)


def test_alibi_bias_is_minus_slope_times_distance_on_both_sides():
  # Encoders see keys after the query too (the causal mask hides that side in decoders).
  slopes = positions.alibi_slopes(4)
  pos = jnp.arange(6)[None]
  bias = np.asarray(positions.BIASES["alibi"](jnp.asarray(slopes), pos, pos, None))[0]
  i, j = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
  np.testing.assert_allclose(bias, -slopes[:, None, None] * np.abs(i - j)[None], rtol=1e-6)


def test_alibi_slopes_are_the_papers_geometric_sequence():
  np.testing.assert_allclose(positions.alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
  np.testing.assert_allclose(positions.alibi_slopes(16), [2.0 ** (-(i + 1) / 2) for i in range(16)])
  # Not a power of two: the 4 slopes of 4 heads, then every other slope of 8 heads.
  np.testing.assert_allclose(positions.alibi_slopes(6),
                             [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


def _t5_bucket_reference(relative_position, bidirectional, num_buckets, max_distance):
  """mesh_tensorflow's _relative_position_bucket, scalar by scalar."""
  ret = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += num_buckets if n < 0 else 0
    n = abs(n)
  else:
    n = max(n, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return ret + n
  val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) *
                        (num_buckets - max_exact))
  return ret + min(val, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_match_the_published_bucketing(bidirectional):
  rel = np.arange(-300, 301)
  got = positions.t5_relative_bucket(jnp.asarray(rel), bidirectional, 32, 128)
  expected = [_t5_bucket_reference(int(r), bidirectional, 32, 128) for r in rel]
  np.testing.assert_array_equal(got, expected)


def _apply_encoder_layer(scheme, x_BLD, rng=0):
  """One bidirectional attention layer with the scheme's embedding and attention terms."""
  cfg = model_config(d_model=16, num_heads=2, max_len=32, position=position_config(scheme),
                     attention="dense")
  B, L, _ = x_BLD.shape


  scheme_mod = positions.make_scheme(cfg)
  sv = scheme_mod.init(jax.random.key(rng), x_BLD, jnp.arange(L)[None], method="embed")
  tv = scheme_mod.init(jax.random.key(rng), False, method="attention_terms")
  variables = {"params": {**sv.get("params", {}), **tv.get("params", {})}}
  h = scheme_mod.apply(variables, x_BLD, jnp.broadcast_to(jnp.arange(L), (B, L)), method="embed")
  terms = scheme_mod.apply(variables, False, method="attention_terms")
  layout = attention.make_layout(L, L, batch=B)
  att = attention.Attention(cfg)
  params = att.init(jax.random.key(1), h, layout, terms)
  return att.apply(params, h, layout, terms)


@pytest.mark.parametrize("scheme", ["none", "sinusoidal", "learned", "rope", "alibi", "t5_bias"])
def test_permutation_equivariance_holds_only_without_positions(scheme):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 6, 16)), jnp.float32)
  perm = np.array([3, 0, 5, 1, 4, 2])
  out = _apply_encoder_layer(scheme, x)
  out_perm = _apply_encoder_layer(scheme, x[:, perm])
  equivariant = np.allclose(out[:, perm], out_perm, atol=1e-5)
  assert equivariant == (scheme == "none")


def test_unknown_scheme_lists_valid_names():
  cfg = model_config(position=position_config("xpos"))
  with pytest.raises(ValueError, match="valid: .*alibi.*rope"):
    positions.make_scheme(cfg)
  with pytest.raises(ValueError, match="valid: .*linear.*yarn"):
    positions.rope_frequencies(position_config("rope", scaling="dynamic"), 16, 64)


def test_sinusoidal_module_honours_max_wavelength():
  """Sinusoidal.embed must pass model.position.max_wavelength on to the table (the paper's
  formula with base W instead of 10000)."""
  d, w, L = 8, 50.0, 12
  cfg = model_config(d_model=d, num_heads=2, max_len=32,
                     position=position_config("sinusoidal", max_wavelength=w))
  x = jnp.zeros((1, L, d), jnp.float32)
  got = np.asarray(positions.Sinusoidal(cfg).apply({}, x, jnp.arange(L)[None], method="embed"))[0]
  expected = np.zeros((L, d))
  for p in range(L):
    for i in range(d // 2):
      angle = p / w ** (2 * i / d)
      expected[p, 2 * i], expected[p, 2 * i + 1] = math.sin(angle), math.cos(angle)
  np.testing.assert_allclose(got, expected, atol=1e-5)
  table = np.asarray(positions.sinusoidal_table(jnp.arange(L), d, max_wavelength=w))
  np.testing.assert_allclose(table, expected, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_t5_bias_module_is_bidirectional_exactly_when_not_causal(causal):
  """A causal (decoder) T5 stack buckets with bidirectional=False, an encoder with True:
  with table[b, h] = b the bias is the reference bucket of key - query."""
  nb, md, L = 16, 32, 40
  cfg = model_config(d_model=16, num_heads=2, max_len=64,
                     position=position_config("t5_bias", num_buckets=nb, max_distance=md))
  table = jnp.tile(jnp.arange(nb, dtype=jnp.float32)[:, None], (1, 2))
  terms = positions.T5Bias(cfg).apply({"params": {"rel_bias": table}}, causal,
                                      method="attention_terms")
  pos = jnp.arange(L)[None]
  got = np.asarray(terms.bias(pos, pos))[0, 0]  # [L, S]
  expected = np.array([[_t5_bucket_reference(k - q, not causal, nb, md) for k in range(L)]
                       for q in range(L)])
  np.testing.assert_array_equal(got, expected)


def test_learned_positions_take_exactly_max_len_tokens():
  """A learned table of max_len rows embeds a sequence of max_len tokens (row p for position p)
  and refuses max_len + 1."""
  d, max_len = 8, 6
  cfg = model_config(d_model=d, num_heads=2, max_len=max_len,
                     position=position_config("learned"))
  table = jnp.arange(max_len * d, dtype=jnp.float32).reshape(max_len, d)
  x = jnp.zeros((1, max_len, d), jnp.float32)
  got = positions.Learned(cfg).apply({"params": {"pos_embedding": table}}, x,
                                     jnp.arange(max_len)[None], method="embed")
  np.testing.assert_array_equal(np.asarray(got)[0], np.asarray(table))
  with pytest.raises(ValueError, match="exceeds the learned position table"):
    positions.Learned(cfg).apply({"params": {"pos_embedding": table}},
                                 jnp.zeros((1, max_len + 1, d)), jnp.arange(max_len + 1)[None],
                                 method="embed")


@pytest.mark.parametrize("scaling", ["llama3", "yarn"])
def test_rope_original_max_len_zero_means_model_max_len(scaling):
  """original_max_len=0 stands for model.max_len, so it must equal giving max_len explicitly
  (and differ from giving another length)."""
  kw = dict(theta=10_000.0, scaling=scaling, scaling_factor=4.0)
  implicit, f0, _ = positions.rope_frequencies(position_config("rope", **kw), 64, 2048)
  explicit, f1, _ = positions.rope_frequencies(
      position_config("rope", original_max_len=2048, **kw), 64, 2048)
  other, _, _ = positions.rope_frequencies(
      position_config("rope", original_max_len=4096, **kw), 64, 2048)
  np.testing.assert_array_equal(implicit, explicit)
  assert f0 == f1
  assert not np.allclose(implicit, other)
