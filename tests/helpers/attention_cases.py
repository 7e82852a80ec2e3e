"""Pieces of the attention tests' cases (tests/attention_test.py, accelerators_test.py)."""

import jax.numpy as jnp
import numpy as np

from transformer.model.positions import AttentionTerms, alibi_slopes


def positions_of(seg_BL):
  """Positions restarting at 0 wherever the segment id changes (packing and padding)."""
  pos = np.zeros_like(seg_BL)
  for i in range(1, seg_BL.shape[1]):
    pos[:, i] = np.where(seg_BL[:, i] == seg_BL[:, i - 1], pos[:, i - 1] + 1, 0)
  return pos


def bias_terms(bias: str, *, causal: bool, num_heads: int, rng) -> AttentionTerms:
  """No bias (""), ALiBi's slopes ("alibi"), or a random T5 bucket table ("t5": 32 buckets,
  max distance 128, bidirectional buckets when not causal) drawn from `rng`."""
  if bias == "alibi":
    return AttentionTerms(bias_table=jnp.asarray(alibi_slopes(num_heads)), bias_kind="alibi")
  if bias == "t5":
    table = rng.normal(size=(32, num_heads)).astype(np.float32)
    return AttentionTerms(bias_table=jnp.asarray(table), bias_kind="t5",
                          bias_settings=(not causal, 32, 128))
  return AttentionTerms()
