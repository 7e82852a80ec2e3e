"""Attention implementations against an independent numpy formula and against each other."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.schema import model_config
from transformer.model import attention
from transformer.model.attention import reference
from transformer.model.positions import AttentionTerms
from tests.helpers.attention_cases import bias_terms, positions_of

B, L, N, H = 2, 13, 4, 8

CASES = {
    # name: (causal, window, kv_heads, segments, prefix, bias)
    "bidirectional": (False, 0, 4, "one", False, ""),
    "causal": (True, 0, 4, "one", False, ""),
    "padding": (True, 0, 4, "padded", False, ""),
    "packed": (True, 0, 4, "packed", False, ""),
    "window": (True, 4, 4, "one", False, ""),
    "window_bidirectional": (False, 3, 4, "packed", False, ""),
    "gqa": (True, 0, 2, "packed", False, ""),
    "mqa": (False, 0, 1, "padded", False, ""),
    "prefix": (True, 0, 2, "one", True, ""),
    "alibi": (True, 0, 4, "packed", False, "alibi"),
    "t5": (False, 0, 2, "padded", False, "t5"),
    "t5_causal": (True, 5, 2, "packed", False, "t5"),
}


def segments(kind):
  seg = np.ones((B, L), np.int32)
  if kind == "padded":
    seg[0, 9:] = 0
    seg[1, 4:] = 0
  if kind == "packed":
    seg[0, 5:] = 2
    seg[0, 11:] = 0
    seg[1, 3:] = 2
    seg[1, 8:] = 3
  return seg


def make_case(name, seed=0):
  causal, window, K, seg_kind, prefix, bias = CASES[name]
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, L, N, H)).astype(np.float32)
  k = rng.normal(size=(B, L, K, H)).astype(np.float32)
  v = rng.normal(size=(B, L, K, H)).astype(np.float32)
  seg = segments(seg_kind)
  pos = positions_of(seg)
  pre = None
  if prefix:
    pre = np.zeros((B, L), bool)
    pre[0, :4] = True
    pre[1, :7] = True
  layout = attention.make_layout(
      L, L, batch=B, q_segments=jnp.asarray(seg), k_segments=jnp.asarray(seg),
      q_positions=jnp.asarray(pos), k_positions=jnp.asarray(pos),
      prefix=None if pre is None else jnp.asarray(pre), causal=causal, window=window)
  terms = bias_terms(bias, causal=causal, num_heads=N, rng=rng)
  return q, k, v, seg, pos, pre, layout, terms


def numpy_reference(q, k, v, seg, pos, pre, causal, window, bias_BNLS):
  """softmax(QK^T / sqrt(d) + bias + mask) V, one head and one query at a time."""
  K = k.shape[2]
  out = np.zeros_like(q)
  for b in range(B):
    for n in range(N):
      kv = n // (N // K)
      for i in range(L):
        allowed = []
        for j in range(L):
          ok = seg[b, i] == seg[b, j] and seg[b, j] != 0
          if causal:
            ok = ok and (j <= i or (pre is not None and pre[b, j]))
          if window:
            ok = ok and abs(i - j) < window
          allowed.append(ok)
        allowed = np.array(allowed)
        if not allowed.any():
          continue  # a query that sees nothing gives zeros
        scores = q[b, i, n] @ k[b, :, kv].T / math.sqrt(H)
        if bias_BNLS is not None:
          scores = scores + bias_BNLS[b, n, i]
        scores = np.where(allowed, scores, -np.inf)
        w = np.exp(scores - scores.max())
        w /= w.sum()
        out[b, i, n] = w @ v[b, :, kv]
  return out


cfg = model_config(attention_chunk=4, attention_query_block=4)


@functools.lru_cache(maxsize=None)
def compiled(impl):
  fn = attention.IMPLEMENTATIONS[impl]
  return jax.jit(lambda q, k, v, lay, terms: fn(q, k, v, lay, terms, scale=H ** -0.5, cfg=cfg))


@pytest.mark.parametrize("name", sorted(CASES))
def test_dense_matches_numpy_formula(name):
  q, k, v, seg, pos, pre, layout, terms = make_case(name)
  causal, window = CASES[name][:2]
  bias = terms.bias(layout.q_pos_BL, layout.k_pos_BS)
  expected = numpy_reference(q, k, v, seg, pos, pre, causal, window,
                             None if bias is None else np.asarray(bias))
  got = compiled("dense")(q, k, v, layout, terms)
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("impl", ["chunked", "query_blocks", "auto"])
def test_exact_implementations_match_dense(impl, name):
  q, k, v, _, _, _, layout, terms = make_case(name)
  expected = compiled("dense")(q, k, v, layout, terms)
  np.testing.assert_allclose(compiled(impl)(q, k, v, layout, terms), expected, atol=1e-5)


@functools.lru_cache(maxsize=None)
def compiled_grad(impl):
  """Gradients of a nonlinear function of the output w.r.t. q, k, v and the bias table."""
  fn = attention.IMPLEMENTATIONS[impl]

  def loss(q, k, v, table, lay, terms):
    if table is not None:
      terms = AttentionTerms(bias_table=table, bias_kind=terms.bias_kind,
                             bias_settings=terms.bias_settings)
    return jnp.sum(jnp.sin(fn(q, k, v, lay, terms, scale=H ** -0.5, cfg=cfg)))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("impl", ["chunked", "query_blocks"])
def test_gradients_match_dense(impl, name):
  q, k, v, _, _, _, layout, terms = make_case(name)
  table = terms.bias_table if terms.bias_kind == "t5" else None  # the learned bias
  expected = compiled_grad("dense")(q, k, v, table, layout, terms)
  got = compiled_grad(impl)(q, k, v, table, layout, terms)
  for a, b in zip(expected, got):
    if a is not None:
      np.testing.assert_allclose(b, a, atol=2e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_visible_keys_cover_every_allowed_key(name):
  """The key range query_blocks computes for a block holds every key its mask allows, and
  for a causal or windowed mask without a prefix it is no wider than needed."""
  *_, layout, _ = make_case(name)
  mask = np.asarray(layout.mask()[:, 0])  # [B, L, S]
  for start in range(0, L, 4):
    stop = min(start + 4, L)
    lo, hi = layout.visible_keys(start, stop, L)
    allowed = np.nonzero(mask[:, start:stop].any(axis=(0, 1)))[0]
    if len(allowed):
      assert lo <= allowed.min() and allowed.max() < hi, (start, lo, hi, allowed)
    causal, window, _, _, prefix, _ = CASES[name]
    if causal and not prefix:
      assert hi == stop
    if window and not prefix:
      assert lo == max(start - window + 1, 0)


def test_query_blocks_skips_keys_above_the_diagonal():
  """Only the blocks a causal mask can see are computed: the compiled program of a causal
  layout has fewer score entries than the bidirectional one."""
  q, k, v, _, _, _, _, terms = make_case("causal")
  flops = {}
  for causal in (False, True):
    lay = attention.make_layout(L, L, batch=B, causal=causal)
    flops[causal] = compiled("query_blocks").lower(q, k, v, lay, terms).compile() \
        .cost_analysis()["flops"]
  # Blocks of 4 of 13 queries see 4, 8, 12 and 13 keys instead of 13: 37/52 of the work.
  assert flops[True] < 0.8 * flops[False], flops


@pytest.mark.parametrize("name", ["causal", "packed", "gqa", "prefix", "alibi", "bidirectional"])
def test_block_sparse_is_dense_under_the_block_local_pattern(name):
  q, k, v, _, _, _, layout, terms = make_case(name)
  got = compiled("block_sparse")(q, k, v, layout, terms)
  # Dense attention with the block-local pattern added: segment 0 hides what the pattern hides.
  weights = reference.masked_softmax(
      reference._scores(reference._group(q, k.shape[2]), k, layout, terms, H ** -0.5),
      attention.block_local_mask(layout, cfg.attention_chunk)[:, :, None])
  expected = jnp.einsum("bkgls,bskh->blkgh", weights, v).reshape(B, L, N, H)
  np.testing.assert_allclose(got, expected, atol=1e-5)
  if name in ("causal", "prefix"):  # one long document:: the pattern really drops far keys
    assert not np.allclose(got, compiled("dense")(q, k, v, layout, terms), atol=1e-3)


@pytest.mark.parametrize("name", ["bidirectional", "causal", "padding", "packed", "gqa", "mqa"])
def test_linear_attention_matches_its_formula(name):
  q, k, v, seg, _, _, layout, terms = make_case(name)
  causal = CASES[name][0]
  K = k.shape[2]
  phi = lambda x: np.where(x > 0, x + 1, np.exp(x))
  expected = np.zeros_like(q)
  for b in range(B):
    for n in range(N):
      for i in range(L):
        js = [j for j in range(L) if seg[b, j] == seg[b, i] != 0 and (not causal or j <= i)]
        if not js:
          continue
        qi = phi(q[b, i, n])
        ks = phi(k[b, js, n // (N // K)])
        w = ks @ qi
        expected[b, i, n] = (w / w.sum()) @ v[b, js, n // (N // K)]
  np.testing.assert_allclose(compiled("linear")(q, k, v, layout, terms), expected, atol=1e-4)


@pytest.mark.parametrize("case,message", [("window", "sliding window"), ("alibi", "bias"),
                                          ("prefix", "prefix")])
def test_linear_refuses_what_it_cannot_honour(case, message):
  q, k, v, _, _, _, layout, terms = make_case(case)
  with pytest.raises(ValueError, match=message):
    compiled("linear")(q, k, v, layout, terms)


def test_cudnn_refuses_clearly_without_a_gpu():
  if jax.default_backend() == "gpu":
    pytest.skip("a GPU is present")
  q, k, v, _, _, _, layout, terms = make_case("causal")
  with pytest.raises(ValueError, match="needs a GPU"):
    compiled("cudnn")(q, k, v, layout, terms)


def test_unknown_implementation_lists_valid_names():
  with pytest.raises(ValueError, match="valid: .*chunked.*dense"):
    attention.get_implementation("flash")


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["dense", "chunked", "query_blocks", "linear", "block_sparse"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(impl):
  q, k, v, seg, _, _, layout, terms = make_case("padding")
  out = compiled(impl)(q, k, v, layout, terms)
  assert np.isfinite(np.asarray(out)).all()
  np.testing.assert_array_equal(np.asarray(out)[seg == 0], 0.0)
  fn = attention.IMPLEMENTATIONS[impl]
  g = jax.grad(lambda q: jnp.sum(fn(q, k, v, layout, terms, scale=H ** -0.5, cfg=cfg)))(q)
  assert np.isfinite(np.asarray(g)).all()


def test_seed_toy_bank_and_river():
  """The second seed's hand-checkable example, through the real Attention module: "bank" has
  query (2.3, 1.0), "river" key (1.5, 0.8), "the" key (0, 0). Score 4.25, 3.0 after dividing by
  sqrt(2), and river gets e^3.0 ~ 20x the weight of "the"."""
  # Toy embeddings (nature, finance, content, ambiguous).
  the, river, bank = [0, 0, 0, 0], [1, 0, 1, 0], [0.5, 0.5, 1, 1]
  x = jnp.asarray([[the, river, bank]], jnp.float32)
  w_q = np.zeros((4, 1, 2), np.float32)
  w_q[3, 0] = [2.3, 1.0]  # the query is driven by ambiguity
  w_k = np.zeros((4, 1, 2), np.float32)
  w_k[0, 0] = [1.5, 0.8]  # the key says "I carry a clear (nature) topic"
  toy = model_config(d_model=4, num_heads=1, head_dim=2, attention="dense")
  module = attention.Attention(toy)
  layout = attention.make_layout(3, 3, batch=1, causal=True)
  params = module.init(jax.random.key(0), x, layout, AttentionTerms())["params"]
  params = jax.tree.map(lambda p: p, params)
  params["query"]["kernel"] = jnp.asarray(w_q)
  params["key"]["kernel"] = jnp.asarray(w_k)
  q_bank = np.asarray(bank) @ w_q[:, 0]
  k_river = np.asarray(river) @ w_k[:, 0]
  assert np.dot(q_bank, k_river) == pytest.approx(4.25)
  assert np.dot(q_bank, k_river) / math.sqrt(2) == pytest.approx(3.0, abs=0.01)
  _, state = module.apply({"params": params}, x, layout, AttentionTerms(),
                          mutable=["intermediates"])
  (weights,) = state["intermediates"]["attention_weights"]
  w_bank = np.asarray(weights)[0, 0, 2]  # the row of "bank"
  assert w_bank[1] / w_bank[0] == pytest.approx(math.exp(4.25 / math.sqrt(2)), rel=1e-4)
  assert 19.5 < w_bank[1] / w_bank[0] < 20.5


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["dense", "chunked", "query_blocks"])
def test_huge_masked_scores_give_finite_gradients(impl):
  """A masked score far above the row's allowed maximum must not overflow exp() in the
  backward pass (0 * inf = NaN)."""
  q, k, v, _, _, _, layout, terms = make_case("padding")
  q, k = np.array(q), np.array(k)
  q[..., 0], k[..., 0] = 30.0, np.linspace(-30, 30, L)[None, :, None]
  fn = attention.IMPLEMENTATIONS[impl]
  g = jax.grad(lambda q, k: jnp.sum(fn(q, k, v, layout, terms, scale=1.0, cfg=cfg)),
               argnums=(0, 1))(q, k)
  assert all(np.isfinite(np.asarray(x)).all() for x in g)
