"""A decoding step's attention over a prefix of the cache that covers the filled slots equals
dense attention over the whole cache, at every fill level, and never reads past the prefix.

The reference is `dense` (reference.py) on the same cache in [B, S, K, H] with the layout
decode.step_layout gives the step; `cached` sees the cache heads first and in blocks
(to_blocks), with every slot past the prefix it chose set to NaN (one read would poison the
output). Small blocks (4 slots: prefixes 4, 8, 12, 13) over 13- and 5-slot caches exercise
every prefix; write_slot is checked against a scatter into the whole cache.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.inference import decode
from transformer.model.attention.cached import (block_sizes, cached, from_blocks, prefix_lengths,
                                                to_blocks, write_slot)
from transformer.model.attention.layout import Layout
from transformer.model.attention.reference import dense
from transformer.model.positions import AttentionTerms, alibi_slopes

B, N, H = 2, 4, 8
START_B = np.asarray([0, 3], np.int32)  # the second row is left-padded by 3


def terms_for(bias, rng):
  if bias == "alibi":
    return AttentionTerms(bias_table=jnp.asarray(alibi_slopes(N)), bias_kind="alibi")
  if bias == "t5":
    table = jnp.asarray(rng.normal(size=(32, N)).astype(np.float32))
    return AttentionTerms(bias_table=table, bias_kind="t5", bias_settings=(False, 32, 128))
  return AttentionTerms()


def queries_layout(index, L, slots, window):
  """The layout of L consecutive new queries ending at token index `index` (decode.step_layout
  is the L = 1 case; a few tokens fed at once may wrap around a window ring)."""
  one = decode.step_layout(jnp.int32(index), jnp.asarray(START_B), slots, window)
  q_idx_BL = jnp.broadcast_to(jnp.arange(index - L + 1, index + 1, dtype=jnp.int32), (B, L))
  return one.replace(q_seg_BL=jnp.ones((B, L), jnp.int32), q_idx_BL=q_idx_BL,
                     q_pos_BL=q_idx_BL - jnp.asarray(START_B)[:, None])


@functools.partial(jax.jit, static_argnames=("block",))
def both(q, k_BSKH, v_BSKH, poisoned_BKSH, v_poisoned_BKSH, layout: Layout, terms, *, block):
  want = dense(q, k_BSKH, v_BSKH, layout, terms, scale=0.3, cfg=None)
  got = cached(q, to_blocks(poisoned_BKSH, block), to_blocks(v_poisoned_BKSH, block), layout,
               terms, scale=0.3)
  return want, got


@pytest.mark.parametrize("K", [4, 2, 1])  # MHA, GQA, MQA
@pytest.mark.parametrize("bias", ["none", "alibi", "t5"])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("L", [1, 2])
def test_cached_equals_dense_at_every_fill_level(K, bias, window, L):
  rng = np.random.default_rng(K * 100 + len(bias) * 10 + window + L)
  total, block = 13, 4
  slots = min(total, window) if window else total  # decode.cache_length
  terms = terms_for(bias, rng)
  k_BSKH = rng.normal(size=(B, slots, K, H)).astype(np.float32)
  v_BSKH = rng.normal(size=(B, slots, K, H)).astype(np.float32)
  # Token indices from the first one every row can see past its padding to the end, with the
  # ring wrapping several times when there is a window.
  for index in range(max(START_B) + L - 1, total + (2 * slots if window else 0)):
    q = rng.normal(size=(B, L, N, H)).astype(np.float32)
    layout = queries_layout(index, L, slots, window)
    filled = min(index + 1, slots)
    read = next(n for n in prefix_lengths(slots, block) if n >= filled)
    poisoned = lambda x: np.swapaxes(np.where(np.arange(slots)[None, :, None, None] < read,
                                              x, np.nan), 1, 2)
    want, got = both(q, k_BSKH, v_BSKH, poisoned(k_BSKH), poisoned(v_BSKH), layout, terms,
                     block=block)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=1e-5,
                               err_msg=f"index {index}, {filled} of {slots} slots filled")


def test_a_row_that_sees_nothing_gives_zeros_like_the_reference():
  # Row 1 is padding up to index 3: at index 1 its query has no visible key at all.
  rng = np.random.default_rng(0)
  k = rng.normal(size=(B, 8, 2, H)).astype(np.float32)
  q = rng.normal(size=(B, 1, N, H)).astype(np.float32)
  layout = decode.step_layout(jnp.int32(1), jnp.asarray(START_B), 8, 0)
  layout = layout.replace(q_seg_BL=jnp.asarray([[1], [0]], jnp.int32))
  blocks = to_blocks(jnp.swapaxes(k, 1, 2), 4)
  got = jax.jit(functools.partial(cached, scale=0.3))(q, blocks, blocks, layout,
                                                      AttentionTerms())
  want = dense(q, k, k, layout, AttentionTerms(), scale=0.3, cfg=None)
  np.testing.assert_array_equal(np.asarray(got)[1], 0.0)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)


def test_prefix_lengths_grow_by_about_sqrt2_in_blocks_and_end_at_the_cache():
  assert prefix_lengths(13, 4) == (4, 8, 12, 13)
  assert prefix_lengths(4112) == (256, 512, 768, 1024, 1536, 2048, 3072, 4096, 4112)
  assert prefix_lengths(100) == (100,)  # a cache shorter than a block: one prefix


def test_one_compiled_step_serves_every_fill_level():
  traces = []

  @jax.jit
  def step(q, k, v, index):
    traces.append(1)
    layout = decode.step_layout(index, jnp.asarray(START_B), 16, 0)
    return cached(q, k, v, layout, AttentionTerms(), scale=0.3)

  q, kv = jnp.ones((B, 1, N, H)), to_blocks(jnp.ones((B, 2, 16, H)), 4)
  for index in (3, 7, 15):
    step(q, kv, kv, jnp.int32(index))
  assert len(traces) == 1


def test_blocks_end_at_the_prefix_lengths_and_round_trip():
  assert block_sizes(13, 4) == (4, 4, 4, 1)
  assert block_sizes(4112) == (256, 256, 256, 256, 512, 512, 1024, 1024, 16)
  x = jnp.arange(2 * 3 * 13 * 2, dtype=jnp.float32).reshape(2, 3, 13, 2)
  blocks = to_blocks(x, 4)
  assert [b.shape[2] for b in blocks] == [4, 4, 4, 1]
  np.testing.assert_array_equal(from_blocks(blocks), x)


@pytest.mark.parametrize("slot", [0, 3, 4, 11, 12])
def test_write_slot_sets_one_slot_of_one_block(slot):
  rng = np.random.default_rng(slot)
  x = rng.normal(size=(2, 3, 13, 2)).astype(np.float32)
  new = rng.normal(size=(2, 3, 1, 2)).astype(np.float32)
  got = jax.jit(write_slot)(to_blocks(jnp.asarray(x), 4), jnp.asarray(new), jnp.int32(slot))
  want = x.copy()
  want[:, :, slot] = new[:, :, 0]
  np.testing.assert_array_equal(np.asarray(from_blocks(got)), want)
