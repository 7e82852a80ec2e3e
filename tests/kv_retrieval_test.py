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


def test_fixed_size_items_are_exactly_max_chars_long_with_distinct_keys():
  """Every fixed-size item's inputs is max_chars long (validate sizes rows by it); its keys are
  distinct, and the query position is uniform over all pairs, the last included. The key
  width grows with 4 * num_pairs."""
  rng = random.Random(1)
  for num_pairs in (1, 4, 30, 250):
    positions = set()
    for _ in range(200 if num_pairs == 4 else 5):
      inputs, target = kv_retrieval.item(rng, num_pairs)
      assert len(inputs) == kv_retrieval.max_chars(num_pairs)
      pairs, query = inputs.split(" ? ")
      keys = [p.split(":")[0] for p in pairs.split(" ")]
      assert len(set(keys)) == len(keys) == num_pairs
      positions.add(keys.index(query))
      assert len(query) == 1 + (4 if num_pairs == 250 else 3) and len(target) == len(query)
    if num_pairs == 4:
      assert positions == {0, 1, 2, 3}
  with pytest.raises(ValueError, match=r"position must be in \[0, 4\)"):
    kv_retrieval.item(rng, 4, position=4)
