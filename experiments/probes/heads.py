"""Attention maps of a trained decoder, word by word, and an automatic census of heads.

Tokens may be bytes or pieces; words are recovered from character offsets, a word's row is
its last token (the position that predicts what follows it) and a word's column sums the
weight given to all of its tokens.
"""

import os

import numpy as np

from transformer import data
from transformer.analysis import attention_maps
from transformer.model import models


def _word_spans(tokenizer, text: str):
  """[(word, first_token, end_token)] in the sequence BOS + encode(text)."""
  spans, start = [], 0
  for word in text.split(" "):
    end = start + len(word)
    a = 1 + len(tokenizer.encode(text[:start]))
    b = 1 + len(tokenizer.encode(text[:end]))
    spans.append((word, a, b))
    start = end + 1
  return spans


def _weights(model, params, tokenizer, text: str):
  tokens = np.asarray([[tokenizer.bos_id] + tokenizer.encode(text)], np.int32)
  captured = attention_maps.capture(model, {"params": params}, tokens)
  layers = sorted(captured, key=lambda k: int(k.split("layers_")[1].split("/")[0]))
  return [captured[k][0] for k in layers]  # per layer: [N, L, L]


def word_matrix(weights_NLL, spans):
  """[N, words, 1 + words]: column 0 is the BOS token."""
  rows = []
  for _, _, end in spans:
    q = weights_NLL[:, end - 1]
    cols = [q[:, 0]] + [q[:, a:b].sum(-1) for _, a, b in spans]
    rows.append(np.stack(cols, -1))
  return np.stack(rows, 1)


def census(model, params, tokenizer, num_items: int, seed: int) -> dict:
  """Per layer and head: previous-token weight, first-token (sink) weight, and how much
  more the position before a verb attends to its subject than to the nearest attractor."""
  prev, sink, subject = [], [], []
  for k in (1, 2):
    for item in data.agreement_probes(num_items, k, seed=seed):
      spans = _word_spans(tokenizer, item.prefix)
      layers = _weights(model, params, tokenizer, item.prefix)
      W = np.stack(layers)  # [layers, N, L, L]
      L = W.shape[-1]
      prev.append(np.mean([W[:, :, i, i - 1] for i in range(1, L)], axis=0))
      sink.append(np.mean([W[:, :, i, 0] for i in range(4, L)], axis=0))
      _, ha, hb = spans[1]  # "The <subject> ..."
      _, aa, ab = spans[-1]  # the prefix ends with the nearest attractor noun
      last = W[:, :, L - 1]
      subject.append(last[..., ha:hb].sum(-1) - last[..., aa:ab].sum(-1))
  return {"previous_token": np.mean(prev, 0), "first_token_sink": np.mean(sink, 0),
          "subject_minus_attractor": np.mean(subject, 0)}


def maps_and_summary(model_config, params, tokenizer, sentence: str, layer: int,
                     workdir: str, exp) -> dict:
  model = models.make_model(model_config)
  spans = _word_spans(tokenizer, sentence)
  layers = _weights(model, params, tokenizer, sentence)
  layer = layer % len(layers)
  words = [w for w, _, _ in spans]
  paths = []
  for i, w in enumerate(layers):
    path = os.path.join(workdir, f"attention_layer{i}.png")
    attention_maps.plot_heads(word_matrix(w, spans), words, path, key_labels=["<s>"] + words,
                              title=f"layer {i}: word-level attention (row = last token of the "
                                    f"word, column = summed over the word's tokens)")
    paths.append(os.path.basename(path))
  stats = census(model, params, tokenizer, exp.census_items, exp.seed)
  notable = []
  for name, threshold, label in [("previous_token", 0.5, "previous-token head"),
                                 ("first_token_sink", 0.5, "attention sink on the first token")]:
    for li, h in zip(*np.nonzero(stats[name] > threshold)):
      notable.append({"layer": int(li), "head": int(h), "kind": label,
                      "score": float(stats[name][li, h])})
  s = stats["subject_minus_attractor"]
  for flat in np.argsort(s, axis=None)[::-1][:3]:
    li, h = np.unravel_index(flat, s.shape)
    if s[li, h] > 0.05:
      notable.append({"layer": int(li), "head": int(h), "kind": "verb-to-subject link",
                      "score": float(s[li, h])})
  return {"sentence": sentence, "layer_shown": layer, "pngs": paths,
          "census": {k: v.round(4).tolist() for k, v in stats.items()},
          "notable_heads": notable}
