"""grammar_floor against brute force: exhaustive enumeration of the generator's own random
choices on tiny lexicons, derivation probabilities recorded while sampling, Monte Carlo."""

import collections
import functools
import hashlib
import math
import random

import numpy as np
import pytest

from transformer import data
from transformer.data import builders, grammar as g, grammar_floor as floor, pipeline


class _Branch(Exception):
  pass


class _Uniform:
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


class _Tracer:
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
    return _Uniform(self)

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


class _Scripted(_Tracer):
  def __init__(self, script):
    super().__init__()
    self.script, self.at = script, 0

  def pick(self, probs):
    if self.at == len(self.script):
      raise _Branch(len(probs))
    self.at += 1
    return self.script[self.at - 1]


class _Recording(_Tracer):
  def __init__(self, seed):
    super().__init__()
    self.rng = random.Random(seed)

  def pick(self, probs):
    return self.rng.choices(range(len(probs)), weights=probs)[0]


def _derivations(generate):
  """Every (output, probability) derivation of generate(rng), by depth-first replay."""
  stack, out = [[]], []
  while stack:
    script = stack.pop()
    rng = _Scripted(script)
    try:
      result = generate(rng)
    except _Branch as b:
      stack.extend(script + [i] for i in range(b.args[0]))
      continue
    if rng.prob > 0:
      out.append((result, rng.prob))
  return out


def _by_string(derivations):
  probs, counts = collections.defaultdict(float), collections.Counter()
  for s, p in derivations:
    probs[s] += p
    counts[s] += 1
  return probs, counts


@pytest.fixture
def tiny(monkeypatch):
  """A lexicon small enough to enumerate, with the collisions that make strings ambiguous:
  'sheep' is its own plural, 'open' an adjective and a verb, 'door' a noun and a cue of
  both senses of 'bank', 'open' also a predicate; 'a' becomes 'an' before 'open'."""

  def use(nouns=(("door", "doors"), ("sheep", "sheep")), subject_budget=1, object_budget=0):
    lexicon = g.Lexicon(
        nouns=nouns, verbs_t=(("opens", "open"),), verbs_i=(("sleeps", "sleep"),),
        adjectives=("open",), adverbs=("again",),
        senses=(g.Sense(("bank", "banks"), (("door", "river"), ("coin", "door")),
                        (("open", "muddy"), ("rich", "open"))),))
    monkeypatch.setattr(g, "lexicon", lambda: lexicon)
    monkeypatch.setattr(g, "_samplers", functools.cache(g._samplers.__wrapped__))
    monkeypatch.setattr(g, "_PREPOSITIONS", ["to"])
    monkeypatch.setattr(g, "_DETERMINERS", {"sg": ("the", "a"), "pl": ("the",)})
    monkeypatch.setattr(g, "_DETERMINER_WEIGHTS", {"sg": (2, 1), "pl": (1,)})
    monkeypatch.setattr(g, "_SUBJECT_BUDGET", subject_budget)
    monkeypatch.setattr(g, "_OBJECT_BUDGET", object_budget)
    floor.clear_caches()
    return lexicon

  yield use
  monkeypatch.undo()
  floor.clear_caches()


def test_default_corpus_is_byte_for_byte_what_it_was():
  # sha256 of these 200 documents as the generator wrote them before data.doc_sentences.
  h = hashlib.sha256()
  for split in ("train", "validation"):
    for i in range(100):
      h.update(g.document(random.Random(f"grammar/{split}/{i}")).encode() + b"\n")
  assert h.hexdigest() == "c2195eacab5435b6818c44a352897680c1668c07d3c98b32247ca4872bdf0b92"
  config = data.default_config()
  assert builders.GrammarCorpus.config_from(config) == "small"  # the same directory as before
  config.doc_sentences = "1,1"
  assert builders.GrammarCorpus.config_from(config).name == "small-sentences1-1"


def test_sentence_probability_is_the_sum_over_its_derivations(tiny):
  tiny()
  probs, counts = _by_string(_derivations(g.sentence))
  assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-12)  # the enumeration is complete
  assert max(counts.values()) >= 2  # some strings are ambiguous, so marginalizing matters
  assert any(" an open " in s or s.startswith("An open") for s in probs)
  for s, p in probs.items():
    assert floor.sentence_prob(s) == pytest.approx(p, rel=1e-9), s
    assert floor.sentence_prob(s, counting=True) == counts[s], s
  # Strings the generator cannot write get nothing: a/an misrendered, no capital, a non-word.
  s = next(s for s in probs if " an open " in s)
  for bad in (s.replace(" an open ", " a open "), s[0].lower() + s[1:], s.replace("open", "opn")):
    assert floor.sentence_prob(bad) == 0.0


def test_noun_phrase_threads_the_shared_modifier_budget(tiny):
  tiny(nouns=(("door", "doors"),))
  probs, _ = _by_string(_derivations(lambda rng: tuple(g._noun_phrase(rng, "sg", [2]))))
  assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-12)
  for words, p in probs.items():
    chart = floor._Chart(words)
    got = sum(q for (end, _), q in chart.noun_phrase(0, "sg", 2).items() if end == len(words))
    assert got == pytest.approx(p, rel=1e-9), words


def test_document_probability_is_the_sum_over_its_derivations(tiny, monkeypatch):
  # Stub sentences isolate the document-level sum (sentence count, the 0.5 sense branch, the
  # sense and positions, the replaced sentences marginalized) so every document enumerates.
  # "Aa." is a regular and a cue sentence, "Cc." cues both senses of the first word.
  lexicon = tiny()
  senses = lexicon.senses + (g.Sense(("x", "xs"), (("y", "z"), ("w", "v")), (("u",), ("t",))),)
  monkeypatch.setattr(g, "lexicon", lambda: g.Lexicon(*dataclass_fields(lexicon)[:-1], senses))
  regular = {"Aa.": 0.7, "Bb.": 0.3}
  cue = {(0, 0): {"Cc.": 0.6, "Aa.": 0.4}, (0, 1): {"Cc.": 1.0},
         (1, 0): {"Dd.": 1.0}, (1, 1): {"Dd.": 0.5, "Bb.": 0.5}}
  use = {(0, 0): {"Ee.": 1.0}, (0, 1): {"Ff.": 0.2, "Ee.": 0.8}, (1, 0): {"Ee.": 1.0},
         (1, 1): {"Gg.": 1.0}}
  pick = lambda rng, dist: rng.choices(list(dist), weights=list(dist.values()))[0]
  monkeypatch.setattr(g, "sentence", lambda rng: pick(rng, regular))
  key = lambda sense, which: (senses.index(sense), which)
  cue_of = lambda cues: next(k for k in cue if senses[k[0]].cues[k[1]] == cues)
  monkeypatch.setattr(g, "_cue_sentence", lambda rng, cues: pick(rng, cue[cue_of(cues)]))
  monkeypatch.setattr(g, "_sense_sentence", lambda rng, s, w: pick(rng, use[key(s, w)]))
  monkeypatch.setattr(floor, "sentence_prob", lambda s: regular.get(s, 0.0))
  invert = lambda table: lambda s: {k: d[s] for k, d in table.items() if s in d}
  monkeypatch.setattr(floor, "_cue_probs", invert(cue))
  monkeypatch.setattr(floor, "_sense_probs", invert(use))
  for sentences in ((1, 4), (2, 2)):
    probs, counts = _by_string(_derivations(lambda rng: g.document(rng, sentences)))
    assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-12)
    assert max(counts.values()) >= 2
    for text, p in probs.items():
      assert math.exp(floor.document_log_prob(text, sentences)) == pytest.approx(p, rel=1e-9)
    assert floor.document_log_prob("Ee. Aa.", sentences) == -math.inf  # a use before its cue


def dataclass_fields(obj):
  return [getattr(obj, f) for f in obj.__dataclass_fields__]


def test_monte_carlo_mean_log_prob_matches_the_sampled_entropy(tiny):
  # Two nouns share the plural "doors": that word has two derivations, both summed.
  tiny(nouns=(("door", "doors"), ("gate", "doors")), subject_budget=0)
  probs, counts = _by_string(_derivations(g.sentence))
  assert counts["The doors sleep."] == 2
  for s, p in probs.items():
    assert floor.sentence_prob(s) == pytest.approx(p, rel=1e-9), s
  num = 20_000
  texts = [g.document(random.Random(i), (1, 1)) for i in range(num)]
  counts = np.array(list(collections.Counter(texts).values()))
  freq = counts / num
  # Plug-in entropy with the Miller-Madow correction for the unseen tail.
  sampled = float(-(freq * np.log(freq)).sum()) + (len(counts) - 1) / (2 * num)
  nll = np.array([-floor.document_log_prob(t, (1, 1)) for t in texts])
  assert abs(nll.mean() - sampled) < 4 * nll.std() / math.sqrt(num) + 0.01
  exact = sum(-p * math.log(p) for p in probs.values())
  assert nll.mean() == pytest.approx(exact, abs=4 * nll.std() / math.sqrt(num))


def test_the_real_generators_derivation_is_a_lower_bound_and_exact_when_unambiguous():
  floor.clear_caches()
  for seed in range(60):
    rng = _Recording(seed)
    text = g.sentence(rng)
    p = floor.sentence_prob(text)
    assert p >= rng.prob * (1 - 1e-9), text
    if floor.sentence_prob(text, counting=True) == 1:
      assert p == pytest.approx(rng.prob, rel=1e-9), text
  for seed in range(20):
    for sentences in ((3, 7), (1, 1), (2, 3)):
      rng = _Recording(seed)
      text = g.document(rng, sentences)
      # The recorded derivation includes the two sentences the cue pair replaced: a bound.
      assert floor.document_log_prob(text, sentences) >= math.log(rng.prob) - 1e-9, text
  assert {"open", "clean"} <= set(floor.collisions())


def test_validate_refuses_rows_that_could_cut_a_document():
  config = data.default_config()
  config.doc_sentences = "1,1"
  longest = floor.max_document_tokens((1, 1))
  config.seq_len = longest - 2
  with pytest.raises(ValueError, match=f"raise data.seq_len to at least {longest - 1}"):
    pipeline.validate(config, "lm")
  config.seq_len = longest - 1
  pipeline.validate(config, "lm")
  config.doc_sentences, config.seq_len = "3,7", 128  # the default corpus keeps its cut rows
  pipeline.validate(config, "lm")
  config.doc_sentences = "2,1"
  with pytest.raises(ValueError, match="doc_sentences"):
    pipeline.validate(config, "lm")
  # The bound holds on samples and is not loose by an order of magnitude.
  lengths = [len(g.document(random.Random(i), (1, 1))) + 2 for i in range(3000)]
  assert max(lengths) <= longest < 4 * max(lengths)


def test_loss_floor_counts_the_tokens_the_lm_objective_predicts(tmp_path):
  config = data.default_config()
  config.update(size="tiny", data_dir=str(tmp_path), doc_sentences="1,1", seq_len=400)
  tokenizer = data.get_tokenizer(config)
  result = floor.loss_floor(config, tokenizer, max_records=50)
  texts = [r["text"] for r in data.load(config, "validation")][:50]
  assert result["documents"] == 50 and result["exact"]
  assert result["tokens"] == sum(len(t.encode()) + 1 for t in texts)  # bytes + EOS
  nll = -sum(floor.document_log_prob(t, (1, 1)) for t in texts)
  assert result["loss_floor"] == pytest.approx(nll / result["tokens"], rel=1e-12)
  config.seq_len = 40
  assert not floor.loss_floor(config, tokenizer, max_records=50)["exact"]
  config.name = "kv_retrieval"
  assert floor.loss_floor(config, tokenizer) is None
