"""experiments/probes/embeddings.py: the cosine and norm it reports, against hand-made tables."""

import numpy as np
import pytest

from experiments.probes import embeddings


def test_similarity_of_identical_orthogonal_and_random_rows():
  table_VD = np.zeros((6, 4))
  table_VD[[0, 1, 2]] = [3.0, 0.0, 4.0, 0.0]     # one vector three times: cosine 1, norm 5
  table_VD[[3, 4, 5]] = 2 * np.eye(4)[:3]        # orthogonal rows: cosine 0, norm 2
  assert embeddings.similarity(table_VD, [0, 1, 2]) == pytest.approx((1.0, 5.0))
  assert embeddings.similarity(table_VD, [3, 4, 5]) == pytest.approx((0.0, 2.0))
  random_VD = np.random.default_rng(0).normal(size=(64, 256))
  cosine, _ = embeddings.similarity(random_VD, list(range(64)))
  assert abs(cosine) < 0.02                      # independent directions in 256 dims


def test_collapse_toward_one_direction_is_seen():
  """What a tied head does to never-seen tokens: a shared push along one direction."""
  rng = np.random.default_rng(1)
  table_VD = 0.02 * rng.normal(size=(10, 128))
  before, _ = embeddings.similarity(table_VD, list(range(10)))
  table_VD += 0.5 * rng.normal(size=128)         # the same update for every row
  after, norm = embeddings.similarity(table_VD, list(range(10)))
  assert before < 0.1 and after > 0.95 and norm > 5
