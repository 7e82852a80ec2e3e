"""Capturing attention weights from every layer, scanned or not, and rendering heatmaps."""

import jax
import numpy as np
import pytest

from transformer.schema import model_config, position_config
from transformer.analysis import attention_maps
from transformer.model import models

pytestmark = pytest.mark.slow  # whole models compiled per case (conftest.py)


@pytest.mark.parametrize("scan", [False, True])
def test_capture_returns_every_layer_and_head(scan):
  cfg = model_config(kind="encoder_decoder", vocab_size=40, d_model=16, num_layers=2,
                     num_heads=2, d_ff=32, attention="chunked", attention_chunk=4,
                     scan_layers=scan, position=position_config("alibi"))
  model = models.make_model(cfg)
  enc = jax.numpy.arange(4, 11)[None]
  dec = jax.numpy.arange(4, 9)[None]
  variables = model.init(jax.random.key(0), enc, dec)
  weights = attention_maps.capture(model, variables, enc, dec)
  expected = {f"{side}/layers_{i}/{kind}" for i in range(2)
              for side, kind in [("encoder", "self_attention"), ("decoder", "self_attention"),
                                 ("decoder", "cross_attention")]}
  assert set(weights) == expected
  assert weights["decoder/layers_1/cross_attention"].shape == (1, 2, 5, 7)
  for w in weights.values():
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)


def test_plot_heads_writes_a_png(tmp_path):
  words = "The keys to the cabinet are lost".split()
  w = np.random.default_rng(0).dirichlet(np.ones(len(words)), size=(3, len(words)))
  path = attention_maps.plot_heads(w, words, str(tmp_path / "heads.png"), title="layer 0")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _tiny_decoder():
  from transformer.data import tokenizers
  cfg = model_config(vocab_size=260, d_model=32, num_layers=2, num_heads=2, d_ff=64,
                     attention="dense")
  model = models.make_model(cfg)
  params = model.init(jax.random.key(0), *models.dummy_inputs(cfg))["params"]
  return cfg, model, params, tokenizers.BytesTokenizer()


def test_word_rows_sum_to_one_and_spans_cover_every_token():
  from experiments.probes import heads
  cfg, model, params, tok = _tiny_decoder()
  sentence = "The keys to the cabinet beside the doors are missing."
  spans = heads.word_spans(tok, sentence)
  covered = [i for _, a, b in spans for i in range(a, b)]
  assert covered == list(range(1, 1 + len(tok.encode(sentence))))
  for w in heads._weights(model, params, tok, sentence):
    m = heads.word_matrix(w, spans)
    assert m.shape == (2, len(spans), 1 + len(spans))
    np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)


def test_the_map_sentence_is_made_of_grammar_words():
  from configs import probes as probes_config
  from transformer.data import grammar
  sentence = probes_config.get_config().experiment.map_sentence
  words = [w.strip(".").lower() for w in sentence.split(" ")]
  assert set(words) <= grammar.lexicon().word_types()


def test_census_reads_the_verb_and_labels_nouns():
  from experiments.probes import heads
  from transformer import data
  cfg, model, params, tok = _tiny_decoder()
  stats = heads.census(model, params, tok, num_items=3, seed=0, attractors=(2,))
  for name in ("head_noun", "nearest_attractor", "attractors", "subject_minus_attractor"):
    assert stats[name].shape == (2, 2)
  item = data.agreement_probes(1, 2, seed=0)[0]
  roles = heads.noun_roles(item)
  assert roles[0][1] == "head" and sum(r == "attractor" for _, r, _ in roles) == 2
