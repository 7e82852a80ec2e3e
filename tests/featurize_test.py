"""featurize's cutting of long documents: pieces of at most seq_len that give back the
document, every token once."""

import numpy as np
import pytest

from transformer.data import featurize


@pytest.mark.parametrize("n,seq_len", [(23, 8), (24, 8), (8, 8), (3, 8), (1, 1)])
def test_split_chunks_partitions_the_document(n, seq_len):
  features = {"inputs": np.arange(n), "targets": np.arange(n) + 1}
  pieces = featurize.split_chunks(features, seq_len)
  assert len(pieces) == -(-n // seq_len)
  assert all(0 < len(p["inputs"]) <= seq_len for p in pieces)
  for key, whole in features.items():
    np.testing.assert_array_equal(np.concatenate([p[key] for p in pieces]), whole)
