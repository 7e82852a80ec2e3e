"""Attention maps of a trained decoder, word by word, and an automatic census of heads.

Tokens may be bytes or pieces. Words are recovered from character offsets; every token
belongs to exactly one word (the space before a word is that word's, as in a piece
tokenizer's "▁word"), and BOS is its own column, so the key columns partition the sequence.
A word's row is the mean of its tokens' rows: each token row is a distribution over the keys
before it, a mean of distributions is one, so word rows still sum to 1 (a sum over the query
tokens would weigh a word by its length instead).

The census reads attention where the model decides the verb's number: the probe prefix is
fed with the agreeing verb after it (teacher-forced) and the query is the verb's first
token. Keys of the verb's own word are left out of every measure, and the nouns before it
are labelled by role and number (head noun, attractors = nouns of the other number,
same-number nouns), so a head that only looks at the last word does not pass as one that
finds the subject.
"""

import dataclasses
import functools
import os

import numpy as np

from transformer import data
from transformer.analysis import attention_maps
from transformer.model import models
from transformer.data import grammar


def word_spans(tokenizer, text: str):
  """[(word, first_token, end_token)] in the sequence BOS + encode(text); the spans (from 1)
  cover every token once: a word's span starts at the space before it."""
  spans, start = [], 0
  for i, word in enumerate(text.split(" ")):
    end = start + len(word)
    a = 1 + len(tokenizer.encode(text[:max(start - 1, 0)])) if i else 1
    b = 1 + len(tokenizer.encode(text[:end]))
    spans.append((word, a, b))
    start = end + 1
  return spans


def _captured(model, params, tokens_BL):
  """Per layer, in order: the attention weights [B, N, L, L]."""
  captured = attention_maps.capture(model, {"params": params}, tokens_BL)
  layers = sorted(captured, key=lambda k: int(k.split("layers_")[1].split("/")[0]))
  return [captured[k] for k in layers]


def _weights(model, params, tokenizer, text: str):
  tokens = np.asarray([[tokenizer.bos_id] + tokenizer.encode(text)], np.int32)
  return [w[0] for w in _captured(model, params, tokens)]  # per layer: [N, L, L]


def word_matrix(weights_NLL, spans):
  """[N, words, 1 + words]: column 0 is BOS, column 1 + j sums the keys of word j, row i
  averages the query tokens of word i. Rows sum to 1 when the spans cover the sequence."""
  rows = []
  for _, qa, qb in spans:
    q = weights_NLL[:, qa:qb].mean(1)  # [N, L]
    cols = [q[:, 0]] + [q[:, a:b].sum(-1) for _, a, b in spans]
    rows.append(np.stack(cols, -1))
  return np.stack(rows, 1)


@functools.cache
def _noun_numbers() -> dict:
  out = {}
  for sg, pl in grammar.lexicon().nouns:
    out[sg], out[pl] = "sg", "pl"
  return out


def noun_roles(item) -> list[tuple[int, str, str]]:
  """[(word index, role, number)] of the nouns in an agreement prefix: "head" (the
  subject), "attractor" (the other number) or "same_number" (an inserted noun of the head's
  number). agreement_probes builds "the N (prep the N)*", so nouns are words 1, 4, 7, ..."""
  words = item.prefix.split(" ")
  numbers = _noun_numbers()
  out = []
  for i in range(1, len(words), 3):
    number = numbers[words[i]]
    role = "head" if i == 1 else ("attractor" if number != numbers[words[1]] else "same_number")
    out.append((i, role, number))
  return out


@dataclasses.dataclass
class VerbRow:
  """One agreement item fed with its agreeing verb: every layer's weights [layers, N, L, L],
  the word spans, the nouns' roles (noun_roles) and the token holding the verb's first
  character (after the space before it), which is the census's query."""
  item: object
  weights: np.ndarray
  spans: list
  roles: list
  verb_first: int

  def mass(self, word: int) -> np.ndarray:
    """[layers, N]: the query's weight on the keys of word `word` (the verb's own word's keys
    are never asked for)."""
    _, a, b = self.spans[word]
    return self.weights[:, :, self.verb_first, a:b].sum(-1)


def verb_rows(model, params, tokenizer, num_items: int, seed: int, attractors=(1, 2, 3),
              max_len: int | None = None, batch: int = 1):
  """A VerbRow per agreement item (num_items per attractor count, in order), or None for an
  item longer than max_len (a learned position table cannot place it).

  batch > 1 feeds the items that many at a time, right-padded to the longest item, so one
  program is compiled instead of one per length. Attention is causal, so the padding after a
  position leaves its weights unchanged up to rounding (the products have other shapes)."""
  items = [item for k in attractors for item in data.agreement_probes(num_items, k, seed=seed)]
  texts = [f"{item.prefix} {item.correct}" for item in items]
  tokens = [[tokenizer.bos_id] + tokenizer.encode(text) for text in texts]
  fits = [max_len is None or len(t) <= max_len for t in tokens]
  width = max((len(t) for t, ok in zip(tokens, fits) if ok), default=0)
  for start in range(0, len(items), batch):
    chunk = range(start, min(start + batch, len(items)))
    if batch > 1 and any(fits[i] for i in chunk):
      padded = np.zeros((batch, width), np.int32)
      for row, i in enumerate(chunk):
        if fits[i]:
          padded[row, :len(tokens[i])] = tokens[i]
      W_LBNLL = np.stack(_captured(model, params, padded))
    for row, i in enumerate(chunk):
      if not fits[i]:
        yield None
        continue
      n = len(tokens[i])
      W = (W_LBNLL[:, row, :, :n, :n] if batch > 1
           else np.stack(_captured(model, params, np.asarray([tokens[i]], np.int32)))[:, 0])
      yield VerbRow(items[i], W, word_spans(tokenizer, texts[i]), noun_roles(items[i]),
                    len(tokenizer.encode(texts[i][:len(items[i].prefix) + 2])))


def census(model, params, tokenizer, num_items: int, seed: int,
           attractors=(1, 2, 3), max_len: int | None = None) -> dict:
  """Per layer and head ([layers, heads] arrays):
    previous_token: mean weight on the previous token (every position of the sentence);
    first_token_sink: mean weight on BOS (positions >= 4);
    and at the verb's first token, keys of the verb's own word excluded:
    head_noun, nearest_attractor, attractors (all of them), same_number: the weight on those
    nouns' words; subject_minus_attractor = head_noun - nearest_attractor; and the same
    difference split by the head noun's number (subject_minus_attractor_sg / _pl)."""
  acc = {}
  add = lambda name, v: acc.setdefault(name, []).append(v)
  for probe in verb_rows(model, params, tokenizer, num_items, seed, attractors, max_len):
    if probe is None:
      add("skipped_too_long", 1)  # a learned table cannot position it
      continue
    W = probe.weights
    L = W.shape[-1]
    add("previous_token", W[:, :, np.arange(1, L), np.arange(L - 1)].mean(-1))
    add("first_token_sink", W[:, :, 4:, 0].mean(-1))
    roles = probe.roles
    head = probe.mass(roles[0][0])
    attr = [probe.mass(i) for i, role, _ in roles if role == "attractor"]
    same = [probe.mass(i) for i, role, _ in roles if role == "same_number"]
    add("head_noun", head)
    add("nearest_attractor", attr[-1])
    add("attractors", np.sum(attr, 0))
    if same:
      add("same_number", np.sum(same, 0))
    add("subject_minus_attractor", head - attr[-1])
    add(f"subject_minus_attractor_{roles[0][2]}", head - attr[-1])
  counts = {name: len(v) for name, v in acc.items()}
  acc.pop("skipped_too_long", None)
  out = {name: np.mean(v, 0) for name, v in acc.items()}
  out["items"] = counts
  return out


def notable_heads(stats: dict) -> list[dict]:
  notable = []
  if "previous_token" not in stats:  # no item fitted the model
    return notable
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
  return notable


def census_summary(model_config, params, tokenizer, exp) -> dict:
  model = models.make_model(model_config)
  stats = census(model, params, tokenizer, exp.census_items, exp.seed,
                 max_len=model_config.max_len)
  items = stats.pop("items")
  return {"census": {k: v.round(4).tolist() for k, v in stats.items()},
          "census_items": items, "notable_heads": notable_heads(stats)}


def maps(model_config, params, tokenizer, sentence: str) -> dict:
  """Every layer's word-level attention of one sentence: [heads, words, 1 + words] each."""
  model = models.make_model(model_config)
  spans = word_spans(tokenizer, sentence)
  layers = [word_matrix(w, spans) for w in _weights(model, params, tokenizer, sentence)]
  return {"sentence": sentence, "words": [w for w, _, _ in spans],
          "layers": [m.round(5).tolist() for m in layers],
          "max_row_sum_error": max(float(np.abs(m.sum(-1) - 1).max()) for m in layers)}


def plot_maps(maps_data: dict, workdir: str) -> dict:
  """One PNG per layer of maps()' matrices in workdir; the record without the matrices."""
  words, paths = maps_data["words"], []
  for i, matrix in enumerate(maps_data["layers"]):
    path = os.path.join(workdir, f"attention_layer{i}.png")
    attention_maps.plot_heads(np.asarray(matrix), words, path, key_labels=["<s>"] + words,
                              title=f"layer {i}: word-level attention (row = mean over the "
                                    f"word's tokens, column = sum over them, the space before "
                                    f"a word included)")
    paths.append(os.path.basename(path))
  return {"sentence": maps_data["sentence"], "pngs": paths,
          "max_row_sum_error": maps_data["max_row_sum_error"]}
