"""Cross-entropy sums: against a direct computation, with masks, smoothing and z-loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import schema
from transformer.training import losses


def _inputs(seed=0, B=2, L=5, V=7):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  logits = jax.random.normal(k1, (B, L, V)) * 3
  targets = jax.random.randint(k2, (B, L), 0, V)
  weights = (jax.random.uniform(k3, (B, L)) > 0.3).astype(jnp.float32)
  return logits, targets, weights


def test_nll_and_accuracy_match_a_direct_computation():
  logits, targets, weights = _inputs()
  loss, nll, correct = losses.cross_entropy(logits, targets, weights)
  logp = np.asarray(jax.nn.log_softmax(logits))
  t, w = np.asarray(targets), np.asarray(weights)
  expected = -(np.take_along_axis(logp, t[..., None], -1)[..., 0] * w).sum()
  assert float(nll) == pytest.approx(expected, rel=1e-5)
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  assert float(correct) == ((np.argmax(logp, -1) == t) * w).sum()


def test_padding_contributes_nothing():
  logits, targets, weights = _inputs()
  noisy = logits.at[..., 0].add(100.0 * (1 - weights))  # garbage where weights are 0
  a = losses.cross_entropy(logits, targets, weights)
  b = losses.cross_entropy(noisy, targets, weights)
  np.testing.assert_allclose(a, b, rtol=1e-6)


def test_label_smoothing_mixes_in_the_uniform_target():
  logits, targets, weights = _inputs()
  eps = 0.1
  loss, nll, _ = losses.cross_entropy(logits, targets, weights, label_smoothing=eps)
  logp = np.asarray(jax.nn.log_softmax(logits))
  uniform = -(logp.mean(-1) * np.asarray(weights)).sum()
  assert float(loss) == pytest.approx((1 - eps) * float(nll) + eps * uniform, rel=1e-5)


def test_z_loss_adds_squared_log_normalizer():
  logits, targets, weights = _inputs()
  loss, nll, _ = losses.cross_entropy(logits, targets, weights, z_loss=1e-2)
  log_z = np.asarray(jax.nn.logsumexp(logits, -1))
  assert float(loss) == pytest.approx(float(nll) + 1e-2 * (log_z ** 2 * np.asarray(weights)).sum(),
                                      rel=1e-5)


def test_config_errors_are_one_line_and_name_the_choices():
  with pytest.raises(ValueError, match="valid:"):
    losses.check_config(schema.objective_config("clm"), "decoder")
  with pytest.raises(ValueError, match="trains a 'encoder' model"):
    losses.check_config(schema.objective_config("mlm"), "decoder")


def test_mlm_bytes_read_each_targets_left_neighbour_in_the_unmasked_row():
  """An MLM row's targets are the whole unmasked text, so the token before a target is the
  target to its left: the first text token (after BOS) takes row 1 of the table (no dummy
  prefix), the others row 0."""
  table_2V = jnp.asarray([[0, 0, 0, 1, 2, 3], [0, 0, 0, 10, 20, 30]])
  batch = {"targets": jnp.asarray([[1, 3, 4, 5]]), "weights": jnp.asarray([[0., 1., 1., 1.]])}
  assert float(losses.target_bytes("mlm", batch, table_2V, bos_id=1)) == 10 + 2 + 3
