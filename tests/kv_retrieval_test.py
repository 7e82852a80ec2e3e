"""kv_retrieval items: sizes and widths."""

import random

import pytest

from transformer.data import kv_retrieval


def test_variable_pairs():
  rng = random.Random(0)
  sizes = set()
  for _ in range(200):
    inputs, target = kv_retrieval.item(rng, 32, min_pairs=2)
    pairs = inputs.split(" ? ")[0].split(" ")
    sizes.add(len(pairs))
    assert all(len(p) == len("k000:v000") for p in pairs)  # the width of 32 pairs
    key = inputs.split(" ? ")[1]
    assert f"{key}:{target}" in pairs
    assert len(inputs) <= kv_retrieval.max_chars(32)
  assert min(sizes) == 2 and max(sizes) == 32
  with pytest.raises(ValueError, match="min_pairs"):
    kv_retrieval.item(rng, 4, min_pairs=5)

