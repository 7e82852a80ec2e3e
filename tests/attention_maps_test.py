"""Capturing attention weights from every layer, scanned or not, and rendering heatmaps."""

import jax
import numpy as np
import pytest

from transformer.schema import model_config, position_config
from transformer.analysis import attention_maps
from transformer.model import models


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
