"""Brute force over the grammar generator's own random choices (tests/grammar_floor_test.py):
a tracer that duck-types the random.Random methods grammar.py calls, replays every script of
choices depth first, and multiplies each derivation's branch probabilities exactly."""

import collections
import random

import numpy as np


class Branch(Exception):
  pass


class Uniform:
  """rng.random()'s value, resolved lazily: each `u < t` splits the interval u is known to lie
  in, so a derivation's probability is exactly the product of the branches it took."""

  def __init__(self, tracer):
    self.tracer, self.lo, self.hi = tracer, 0.0, 1.0

  def __lt__(self, t):
    if t <= self.lo:
      return False
    if t >= self.hi:
      return True
    p_true = (t - self.lo) / (self.hi - self.lo)
    below = self.tracer._take([p_true, 1 - p_true]) == 0
    self.lo, self.hi = (self.lo, t) if below else (t, self.hi)
    return below


class Tracer:
  """Duck-types the random.Random methods grammar.py calls; `prob` is the derivation's."""

  def __init__(self):
    self.prob = 1.0

  def pick(self, probs):
    raise NotImplementedError

  def _take(self, probs):
    i = self.pick(probs)
    self.prob *= probs[i]
    return i

  def random(self):
    return Uniform(self)

  def choices(self, population, weights=None, cum_weights=None, k=1):
    assert k == 1
    if cum_weights is not None:
      weights = np.diff([0.0] + list(cum_weights))
    total = float(sum(weights))
    return [population[self._take([w / total for w in weights])]]

  def randint(self, a, b):
    return a + self._take([1 / (b - a + 1)] * (b - a + 1))

  def randrange(self, a, b=None):
    lo, hi = (0, a) if b is None else (a, b)
    return lo + self._take([1 / (hi - lo)] * (hi - lo))

  def choice(self, seq):
    return seq[self._take([1 / len(seq)] * len(seq))]

  def sample(self, seq, k):
    assert k == 2
    pairs = [(i, j) for i in range(len(seq)) for j in range(len(seq)) if i != j]
    i, j = pairs[self._take([1 / len(pairs)] * len(pairs))]
    return [seq[i], seq[j]]


class Scripted(Tracer):
  def __init__(self, script):
    super().__init__()
    self.script, self.at = script, 0

  def pick(self, probs):
    if self.at == len(self.script):
      raise Branch(len(probs))
    self.at += 1
    return self.script[self.at - 1]


class Recording(Tracer):
  def __init__(self, seed):
    super().__init__()
    self.rng = random.Random(seed)

  def pick(self, probs):
    return self.rng.choices(range(len(probs)), weights=probs)[0]


def derivations(generate):
  """Every (output, probability) derivation of generate(rng), by depth-first replay."""
  stack, out = [[]], []
  while stack:
    script = stack.pop()
    rng = Scripted(script)
    try:
      result = generate(rng)
    except Branch as b:
      stack.extend(script + [i] for i in range(b.args[0]))
      continue
    if rng.prob > 0:
      out.append((result, rng.prob))
  return out


def by_string(derivations):
  probs, counts = collections.defaultdict(float), collections.Counter()
  for s, p in derivations:
    probs[s] += p
    counts[s] += 1
  return probs, counts
