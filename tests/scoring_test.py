"""Scorer against a direct forward pass."""

import jax
import numpy as np
import pytest

from transformer.schema import model_config
from transformer.model import models
from transformer.data import tokenizers
from transformer.inference.scoring import Scorer


@pytest.mark.slow
def test_continuation_scores_match_a_forward_pass():
  cfg = model_config(vocab_size=260, d_model=32, num_layers=1, num_heads=2, d_ff=64)
  model = models.make_model(cfg)
  params = model.init(jax.random.key(0), *models.dummy_inputs(cfg))["params"]
  tok = tokenizers.BytesTokenizer()
  scorer = Scorer(cfg, params)
  prefixes, conts = ["The keys to the cabinet", "A dog"], [" are", " barks loudly"]
  logp, exact = scorer.continuation_scores(tok, prefixes, conts, batch_size=4)
  for i, (p, c) in enumerate(zip(prefixes, conts)):
    head = [tok.bos_id] + tok.encode(p)
    row = np.asarray([head + tok.encode(c)])
    logits = model.apply({"params": params}, row[:, :-1])
    lp = jax.nn.log_softmax(logits)[0]
    targets = row[0, 1:]
    span = range(len(head) - 1, row.shape[1] - 1)
    assert logp[i] == pytest.approx(float(sum(lp[j, targets[j]] for j in span)), abs=1e-4)
    assert exact[i] == all(int(np.argmax(lp[j])) == targets[j] for j in span)


def test_rows_that_fit_a_learned_table_are_not_padded_past_it():
  # 1 + 30 + 3 tokens: 33 inputs fit a table of 40, which rounding to 48 would pass.
  from tests.helpers.tiny_models import built
  cfg, _, params = built("decoder", "learned", vocab_size=260, max_len=40)
  scorer, tok = Scorer(cfg, params), tokenizers.BytesTokenizer()
  row = np.asarray([[tok.bos_id] + tok.encode("a" * 30) + tok.encode("bcd")])
  logp, _ = scorer.continuation_scores(tok, ["a" * 30], ["bcd"], batch_size=1)
  assert logp[0] == pytest.approx(-scorer.token_losses(row)[0][0, 30:].sum(), abs=1e-4)


def test_token_losses_of_packed_documents_equal_each_scored_alone():
  """token_losses shifts the segment ids with the inputs, so a packed row's losses within
  each document are that document's alone (the target crossing into the next one aside)."""
  from tests.helpers.tiny_models import built
  cfg, _, params = built("decoder", "rope")
  scorer = Scorer(cfg, params)
  a, b = [1, 5, 6, 7], [1, 9, 10, 11, 12]
  packed, _ = scorer.token_losses([a + b], [[1] * len(a) + [2] * len(b)])
  alone_a, alone_b = scorer.token_losses([a])[0], scorer.token_losses([b])[0]
  np.testing.assert_allclose(packed[0, :len(a) - 1], alone_a[0], atol=1e-5)
  np.testing.assert_allclose(packed[0, len(a):], alone_b[0], atol=1e-5)
