"""What the census's distance control reads for heads that ignore roles, on the census's own
items (200 per attractor count 1-3, seed 0, byte tokens): uniform attention over the keys the
verb's first token sees, and attention decaying as exp(-rate * distance in tokens). At slot s the
subject comes from sentences of exactly s nouns and the other nouns from longer ones, so even a
role-blind head can read above zero (the sentence-length confound).

  PYTHONPATH=. python experiments/records/scripts/census_control_baselines.py
"""
import numpy as np

from experiments.probes import census_control, heads
from transformer import data
from transformer.data import tokenizers


def rows(weight_of_keys):
  tok = tokenizers.BytesTokenizer()
  for k in (1, 2, 3):
    for item in data.agreement_probes(200, k, seed=0):
      text = f"{item.prefix} {item.correct}"
      n = 1 + len(tok.encode(text))
      verb_first = len(tok.encode(text[:len(item.prefix) + 2]))
      w = np.zeros(n)
      w[:verb_first + 1] = weight_of_keys(verb_first - np.arange(verb_first + 1))
      w /= w.sum()
      W = np.zeros((1, 1, n, n))
      W[0, 0, verb_first] = w
      yield heads.VerbRow(item, W, heads.word_spans(tok, text), heads.noun_roles(item), verb_first)


for name, f in [("uniform", lambda d: np.ones_like(d, float)),
                ("exp(-0.02 d)", lambda d: np.exp(-0.02 * d)),
                ("exp(-0.05 d)", lambda d: np.exp(-0.05 * d))]:
  nouns = census_control.noun_weights(rows(f))
  out = census_control.contrasts(nouns, census_control._cells(nouns))
  print(f"{name:14s} " + "  ".join(f"{k} {v[0, 0]:+.3f}" for k, v in out.items()))
