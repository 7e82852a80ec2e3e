"""The decoding step's CPU kernel (transformer/cpu/cached_attention.cc) against dense attention
over the whole cache, and decoding with it against the full forward pass."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.cpu import cached_attention, fused_attention
from transformer.inference import decode
from transformer.model import models
from transformer.model.attention import cached as cached_lib
from transformer.model.attention import make_layout
from transformer.model.attention.reference import dense
from transformer.model.positions import AttentionTerms
from tests.decode_test import check_against_full_forward
from tests.helpers.tiny_models import built

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(fused_attention.unavailable() is not None,
                                reason=f"{fused_attention.unavailable()}")

# name: (B, L new queries, N, K, H, slots, token index of the last query, window, starts)
STEPS = {
    "mha_one_block": (2, 1, 4, 4, 64, 300, 200, 0, (0, 37)),
    "gqa_across_blocks": (3, 1, 4, 2, 64, 1100, 700, 0, (0, 5, 300)),  # row 2: 401 slots
    "head_128_chunk_edges": (1, 1, 2, 2, 128, 800, 511, 0, (0,)),
    "head_48_generic": (2, 1, 2, 1, 48, 600, 599, 0, (3, 0)),
    "three_new_tokens": (2, 3, 4, 2, 64, 700, 300, 0, (0, 10)),
    "window": (2, 1, 4, 4, 64, 1100, 900, 100, (0, 850)),
    "all_masked_row": (2, 1, 4, 4, 16, 520, 7, 0, (0, 300)),  # row 1 starts after index 7
}


def step_case(name, seed=0):
  B, L, N, K, H, S, index, window, starts = STEPS[name]
  rng = np.random.default_rng(seed)
  k_BKSH, v_BKSH = (jnp.asarray(rng.normal(size=(B, K, S, H)), jnp.float32) for _ in range(2))
  q_BLNH = jnp.asarray(rng.normal(size=(B, L, N, H)), jnp.float32)
  start_B = jnp.asarray(starts, jnp.int32)
  layout = decode.step_layout(jnp.int32(index), start_B, S, window)
  if L > 1:  # the step's queries at indices index - L + 1 .. index
    q_idx_BL = jnp.broadcast_to(jnp.arange(index - L + 1, index + 1, dtype=jnp.int32), (B, L))
    layout = layout.replace(q_idx_BL=q_idx_BL, q_seg_BL=jnp.ones((B, L), jnp.int32),
                            q_pos_BL=q_idx_BL - start_B[:, None])
  return q_BLNH, k_BKSH, v_BKSH, layout


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_step_matches_dense_over_the_whole_cache(name, cache_dtype):
  """A bfloat16 cache (model.cache_dtype) against dense float32 attention over the same
  rounded keys and values: the kernel widens each value exactly, so only float32 rounding
  of the arithmetic separates them. XLA's prefixes (kernel=False) are held to the same, and
  to a float16 cache (which the kernel leaves to them)."""
  q_BLNH, k_BKSH, v_BKSH, layout = step_case(name)
  k_BKSH, v_BKSH = (x.astype(cache_dtype) for x in (k_BKSH, v_BKSH))
  scale = q_BLNH.shape[-1] ** -0.5
  k_blocks, v_blocks = cached_lib.to_blocks(k_BKSH), cached_lib.to_blocks(v_BKSH)
  step = jax.jit(lambda q, k, v, lay, kernel: cached_lib.cached(
      q, k, v, lay, AttentionTerms(), scale=scale, kernel=kernel), static_argnums=4)
  hlo = step.lower(q_BLNH, k_blocks, v_blocks, layout, True).as_text()
  assert "transformer_attention_cached" in hlo  # the kernel ran, not the fallback
  # The reference: every slot of the cache, the unfilled ones masked by the layout.
  ref = dense(q_BLNH, *(jnp.swapaxes(x, 1, 2).astype(jnp.float32) for x in (k_BKSH, v_BKSH)),
              layout, AttentionTerms(), scale=scale, cfg=None)
  for kernel in (True, False):
    out = step(q_BLNH, k_blocks, v_blocks, layout, kernel)
    assert out.dtype == jnp.float32  # the queries' dtype, whatever the cache's
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)
  if name == "all_masked_row":
    assert not np.any(np.asarray(out)[1])  # sees no key: zeros, as masked_softmax gives
  if cache_dtype == "bfloat16":
    k16, v16 = (x.astype(jnp.float16) for x in (k_BKSH, v_BKSH))
    out = step(q_BLNH, cached_lib.to_blocks(k16), cached_lib.to_blocks(v16), layout, False)
    ref = dense(q_BLNH, *(jnp.swapaxes(x, 1, 2).astype(jnp.float32) for x in (k16, v16)),
                layout, AttentionTerms(), scale=scale, cfg=None)
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)


def test_cross_attention_reads_every_encoder_slot():
  """Not causal, the encoder's segment ids (padding 0), `filled` the whole cache."""
  rng = np.random.default_rng(1)
  B, L, N, K, H, S = 2, 1, 4, 4, 32, 70
  q = jnp.asarray(rng.normal(size=(B, L, N, H)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(B, K, S, H)), jnp.float32) for _ in range(2))
  enc_seg = jnp.asarray(np.arange(S)[None] < np.array([[70], [41]]), jnp.int32)
  layout = make_layout(L, S, batch=B, q_segments=jnp.ones((B, L), jnp.int32),
                       k_segments=enc_seg)
  out = cached_lib.cached(q, (k,), (v,), layout, AttentionTerms(), scale=0.2, filled=S,
                          kernel=True)
  ref = dense(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), layout, AttentionTerms(),
              scale=0.2, cfg=None)
  np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)


def test_refusals_name_the_reason():
  q = jnp.zeros((1, 4, 1, 64), jnp.float32)
  k = (jnp.zeros((1, 4, 256, 64), jnp.float32),)
  layout = decode.step_layout(jnp.int32(3), jnp.zeros((1,), jnp.int32), 256, 0)
  assert cached_attention.refusal(q, k, layout, AttentionTerms()) is None
  alibi = AttentionTerms(bias_table=jnp.ones((4,)), bias_kind="alibi")
  assert "score bias (alibi)" in cached_attention.refusal(q, k, layout, alibi)
  assert cached_attention.refusal(q, tuple(x.astype(jnp.bfloat16) for x in k), layout,
                                 AttentionTerms()) is None
  assert "queries are bfloat16" in cached_attention.refusal(q.astype(jnp.bfloat16), k, layout,
                                                            AttentionTerms())
  assert "not float16" in cached_attention.refusal(q, tuple(x.astype(jnp.float16) for x in k),
                                                   layout, AttentionTerms())
  assert "divisible by 16" in cached_attention.refusal(q[..., :8], k, layout, AttentionTerms())


def _decoder(kind, scheme="learned", max_len=600):
  """tests/helpers' tiny GQA model at head size 16 (the kernel's case; its default is 8)."""
  _, model, params = built(kind, scheme, d_model=64, max_len=max_len, attention="auto")
  return model, params


@pytest.mark.slow
@pytest.mark.parametrize("kind,scheme", [("decoder", "learned"), ("decoder", "rope"),
                                         ("encoder_decoder", "rope")])
def test_decoding_with_the_kernel_matches_the_full_forward_pass(kind, scheme):
  model, params = _decoder(kind, scheme)
  prompts = [[1, 5, 6], [1, 7, 8, 9, 10]] if kind == "decoder" else [[1], [1, 4]]
  check_against_full_forward(kind, model, params, prompts, T=8)


@pytest.mark.slow
def test_long_decoding_with_the_kernel_equals_the_xla_path(monkeypatch):
  """300 steps cross the first block (256 slots) and chunk: the same tokens and logits as
  the prefixes XLA runs (model.attention='dense' steps without the kernel)."""
  calls = []
  kernel = cached_attention.attention
  monkeypatch.setattr(cached_attention, "attention",
                      lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
  model, params = _decoder("decoder", max_len=700)  # its own compiled programs: traced here
  cfg = model.cfg.copy_and_resolve_references()
  cfg.attention = "dense"
  dense_model = models.make_model(cfg)
  prompts = [[1, 5, 6], [1, 7, 8, 9, 10]]
  run = lambda m: decode.generate(m, params, prompts, max_new_tokens=300, stop_tokens=(),
                                  return_logits=True)
  (tokens, logits), (ref_tokens, ref_logits) = run(model), run(dense_model)
  assert calls, "the kernel was not traced into the auto model's steps"
  np.testing.assert_array_equal(tokens, ref_tokens)
  np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["decoder", "encoder_decoder"])
def test_a_bfloat16_cache_decodes_as_a_float32_one_rounded(kind):
  """model.cache_dtype=bfloat16: half the cache's bytes. The kernel and XLA's prefixes read
  the same rounded keys and values (the same tokens, logits equal to float32 rounding), and
  both stay within bfloat16's rounding of the float32 cache's logits."""
  prompts = [[1, 5, 6], [1, 7, 8, 9, 10]] if kind == "decoder" else [[1], [1, 4]]
  enc = [[3, 4, 5, 6], [7, 8, 9]] if kind == "encoder_decoder" else None
  cfg, _, params = built(kind, "rope", d_model=64, max_len=600, attention="auto")

  def model(**overrides):
    changed = cfg.copy_and_resolve_references()
    changed.update(overrides)
    return models.make_model(changed)

  runs = {name: decode.generate(model(**kw), params, prompts, max_new_tokens=12,
                                stop_tokens=(), encoder_inputs=enc, return_logits=True)
          for name, kw in {"f32": {}, "bf16": dict(cache_dtype="bfloat16"),
                           "bf16_xla": dict(cache_dtype="bfloat16", attention="dense")}.items()}
  np.testing.assert_array_equal(runs["bf16"][0], runs["bf16_xla"][0])
  np.testing.assert_allclose(runs["bf16"][1], runs["bf16_xla"][1], atol=1e-4, rtol=1e-4)
  np.testing.assert_array_equal(runs["bf16"][0], runs["f32"][0])
  gap = np.abs(runs["bf16"][1] - runs["f32"][1]).max()
  assert 0 < gap < 2e-2 * np.abs(runs["f32"][1]).max(), gap  # rounded, and only by that
  if kind == "decoder":
    half, full = (decode.cache_nbytes(decode.init_cache(model(cache_dtype=c), params, 2, 64))
                  for c in ("bfloat16", ""))
    assert 2 * half == full
    # bfloat16 compute keeps a bfloat16 cache by default, held as its bits too.
    held = jax.tree.leaves(decode.init_cache(model(dtype="bfloat16"), params, 2, 64))
    assert {x.dtype for x in held} == {jnp.dtype(jnp.uint16)}


def test_a_bfloat16_cache_is_written_in_place():
  """XLA:CPU computes bfloat16 updates in float32 (a conversion of each whole block per
  step); the cache holds bfloat16 as its bits, so a step's write stays a one-slot update
  and the kernel reads the held buffers (the two bitcasts cancel)."""
  bf16 = jnp.dtype(jnp.bfloat16)
  assert cached_lib.held_dtype(bf16) == jnp.uint16 and cached_lib.held_dtype("float32") == (
      jnp.float32)
  q_BLNH, k_BKSH, v_BKSH, layout = step_case("gqa_across_blocks")
  k_held, v_held = (cached_lib.to_blocks(cached_lib.to_held(x, bf16)) for x in (k_BKSH, v_BKSH))

  def steps(k_held, v_held):
    def body(i, carry):
      k, v, out = carry
      new = q_BLNH[:, :, :2] * i  # [B, 1, K, H]: this step's key and value
      k = cached_lib.write_slot(k, cached_lib.to_held(jnp.swapaxes(new, 1, 2), bf16), 400 + i)
      v = cached_lib.write_slot(v, cached_lib.to_held(jnp.swapaxes(new, 1, 2), bf16), 400 + i)
      return k, v, out + cached_lib.cached(q_BLNH, cached_lib.as_values(k, bf16),
                                           cached_lib.as_values(v, bf16), layout,
                                           AttentionTerms(), scale=0.125, kernel=True)
    return jax.lax.fori_loop(0, 8, body, (k_held, v_held, jnp.zeros_like(q_BLNH)))

  hlo = jax.jit(steps).lower(k_held, v_held).compile().as_text()
  assert "transformer_attention_cached" in hlo
  for block in k_held:
    shape = ",".join(map(str, block.shape))
    assert f"f32[{shape}]" not in hlo and f"bf16[{shape}]" not in hlo, shape
  # Written where asked, rounded once.
  k, v, _ = jax.jit(steps)(k_held, v_held)
  slot_BKH = cached_lib.from_blocks(cached_lib.as_values(k, bf16))[:, :, 407].astype(jnp.float32)
  np.testing.assert_array_equal(slot_BKH, (q_BLNH[:, 0, :2] * 7).astype(bf16).astype(jnp.float32))


def test_the_avx2_build_matches_dense(tmp_path):
  """The AVX2 code of the step kernel, built and checked on any CPU that runs it."""
  script = """
    import numpy as np
    from cpu_cached_attention_test import STEPS, test_a_step_matches_dense_over_the_whole_cache
    for name in sorted(STEPS):
      for cache_dtype in ("float32", "bfloat16"):
        test_a_step_matches_dense_over_the_whole_cache(name, cache_dtype)
    print("ok", len(STEPS))
  """
  env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT}/tests", TRANSFORMER_KERNEL_ISA="avx2",
             TRANSFORMER_KERNEL_CACHE=str(tmp_path / "cache"))
  result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split()[-2:] == ["ok", str(len(STEPS))]
  assert [p.name.startswith("cpu_attention-") for p in (tmp_path / "cache").iterdir()] == [True]
