"""Exact probabilities of grammar_corpus documents, and the corpus' loss floor.

`grammar.document` knows the probability of every random choice it makes, so the
probability of a document *string* is computable: the sum over every derivation
(sequence of random choices) that renders to it. A perfect model's loss is
-log p(document), and the corpus' loss floor is that summed over the evaluation
split and divided by the tokens the lm objective predicts for it.

Why a parser and not the generator's own bookkeeping: a string can have several
derivations (word-class collisions: "open" and "clean" are adjectives and
transitive verbs; cue words shared by senses; one sentence derivable as a regular,
cue and sense sentence), and the derivation's probability is then only a lower bound.
The chart below sums over all of them, so the result is exact (to float rounding):

- a sentence is split into words (the a/an rendering and the capital undone, and the
  rendering redone to reject strings the generator cannot write);
- `_Chart` sums over every parse of a regular sentence; noun phrases thread the
  shared modifier budget (a list the generator mutates depth first) as chart state;
- cue and sense sentences are parsed per (sense, which), and the document sums over
  every n-sentence assignment (which sentence is the cue, which the sense use, which
  sense), the two regular sentences they replaced being marginalized out (sum to 1).
"""

import collections
import functools
import math

import numpy as np

from transformer.data import grammar as g

_NUMBERS = (("sg", 0.55), ("pl", 0.45))          # grammar._number
P_ADJ, P_MODIFIER = 0.3, 0.45                     # grammar._noun_phrase
P_PP, P_OBJECT_RELATIVE, P_SUBJECT_RELATIVE = 0.65, 0.20, 0.15
P_COPULA, P_HAS, P_TRANSITIVE, P_INTRANSITIVE = 0.3, 0.1, 0.35, 0.25  # grammar._predicate
P_PRESENT, P_ADVERB = 0.6, 0.4
P_SENSE_PP, P_SENSE_PRESENT, P_SENSE_DOCUMENT = 0.4, 0.5, 0.5


def _item_probs(sampler) -> list[float]:
  # What rng.choices(cum_weights=...) gives each item: its share of the total weight.
  cum = sampler.cum_weights
  return [(b - a) / cum[-1] for a, b in zip([0.0] + cum[:-1], cum)]


@functools.cache
def _lexical(counting: bool = False) -> dict:
  """(word class, number or None) -> word -> probability its sampler writes that word.

  Sums over items, so two items writing one word are counted as the two derivations they
  are; with counting=True the value is how many items write the word."""
  z, table = g._samplers(), collections.defaultdict(lambda: collections.defaultdict(float))
  for kind in ("noun", "verb_t", "verb_i"):
    for item, p in zip(z[kind].items, _item_probs(z[kind])):
      table[kind, "sg"][item[0]] += 1.0 if counting else p
      table[kind, "pl"][item[1]] += 1.0 if counting else p
  for kind in ("adj", "adv", "prep"):
    for item, p in zip(z[kind].items, _item_probs(z[kind])):
      table[kind, None][item] += 1.0 if counting else p
  for number, dets in g._DETERMINERS.items():
    weights = g._DETERMINER_WEIGHTS[number]
    for det, w in zip(dets, weights):
      table["det", number][det] += 1.0 if counting else w / sum(weights)
  return {k: dict(v) for k, v in table.items()}


def clear_caches() -> None:
  """For tests that swap the lexicon: drops every table derived from it."""
  from transformer.data import grammar_lengths  # it reads this module's tables
  for f in (_lexical, _sense_index, sentence_prob, _cue_probs, _sense_probs,
            grammar_lengths.document_token_distribution):
    f.cache_clear()


def sentence_words(text: str) -> tuple[str, ...] | None:
  """The generator's words for a rendered sentence, or None if it cannot have written it."""
  if not text.endswith(".") or len(text) < 2:
    return None
  body = text[:1].lower() + text[1:-1]
  words = tuple("a" if w == "an" else w for w in body.split(" "))
  return words if g._sentence(list(words)) == text else None


class _Chart:
  """Inside probabilities of one sentence's words under the regular-sentence grammar.

  With counting=True every probability is 1, so the chart counts derivations instead."""

  def __init__(self, words: tuple[str, ...], counting: bool = False):
    self.words, self.counting, self.lex = words, counting, _lexical(counting)
    self._noun_phrases = {}

  def p(self, value):
    return 1.0 if self.counting else value

  def word(self, i, kind, number=None) -> float:
    if i >= len(self.words):
      return 0.0
    return self.lex.get((kind, number), {}).get(self.words[i], 0.0)

  def is_word(self, i, word) -> bool:
    return i < len(self.words) and self.words[i] == word

  def noun_phrase(self, i, number, budget) -> dict:
    """(end, budget left) -> probability that _noun_phrase(number, [budget]) writes words[i:end]."""
    key = (i, number, budget)
    if key not in self._noun_phrases:
      self._noun_phrases[key] = self._noun_phrase(i, number, budget)
    return self._noun_phrases[key]

  def _noun_phrase(self, i, number, budget):
    out, p = collections.defaultdict(float), self.p
    heads = collections.defaultdict(float)  # end of the head noun -> probability
    det = self.word(i, "det", number)
    if det:
      heads[i + 2] += det * p(1 - P_ADJ) * self.word(i + 1, "noun", number)
      heads[i + 3] += (det * p(P_ADJ) * self.word(i + 1, "adj")
                       * self.word(i + 2, "noun", number))
    for j, head in heads.items():
      if not head:
        continue
      if budget == 0:
        out[j, 0] += head
        continue
      out[j, budget] += head * p(1 - P_MODIFIER)
      modifier = head * p(P_MODIFIER)
      for inner, p_inner in _NUMBERS:
        prep = self.word(j, "prep")
        if prep:
          for (k, left), q in self.noun_phrase(j + 1, inner, budget - 1).items():
            out[k, left] += modifier * p(P_PP) * prep * p(p_inner) * q
        if self.is_word(j, "that"):
          for (k, left), q in self.noun_phrase(j + 1, inner, budget - 1).items():
            verb = self.word(k, "verb_t", inner)
            if verb:
              out[k + 1, left] += modifier * p(P_OBJECT_RELATIVE) * p(p_inner) * q * verb
          verb = self.word(j + 1, "verb_t", number)
          if verb:
            for (k, left), q in self.noun_phrase(j + 2, inner, budget - 1).items():
              out[k, left] += modifier * p(P_SUBJECT_RELATIVE) * verb * p(p_inner) * q
    return {k: v for k, v in out.items() if v}

  def object_phrase(self, i) -> dict:
    """end -> probability of _noun_phrase(_number(rng), [_OBJECT_BUDGET]) at i."""
    out = collections.defaultdict(float)
    for number, p_number in _NUMBERS:
      for (k, _), q in self.noun_phrase(i, number, g._OBJECT_BUDGET).items():
        out[k] += self.p(p_number) * q
    return out

  def predicate(self, i, number) -> dict:
    """end -> probability that _predicate(number) writes words[i:end]."""
    out, p = collections.defaultdict(float), self.p
    for tense, p_tense in (("present", P_PRESENT), ("past", 1 - P_PRESENT)):
      if self.is_word(i, g._COPULA[tense][number]):
        out[i + 2] += p(P_COPULA) * p(p_tense) * self.word(i + 1, "adj")
    if self.is_word(i, "has" if number == "sg" else "have"):
      for k, q in self.object_phrase(i + 1).items():
        out[k] += p(P_HAS) * q
    verb = self.word(i, "verb_t", number)
    if verb:
      for k, q in self.object_phrase(i + 1).items():
        out[k] += p(P_TRANSITIVE) * verb * q
    verb = self.word(i, "verb_i", number)
    if verb:
      out[i + 1] += p(P_INTRANSITIVE) * verb * p(1 - P_ADVERB)
      out[i + 2] += p(P_INTRANSITIVE) * verb * p(P_ADVERB) * self.word(i + 1, "adv")
    return out

  def sentence(self) -> float:
    total = 0.0
    for number, p_number in _NUMBERS:
      for (j, _), q in self.noun_phrase(0, number, g._SUBJECT_BUDGET).items():
        total += self.p(p_number) * q * self.predicate(j, number).get(len(self.words), 0.0)
    return total


@functools.lru_cache(maxsize=1 << 16)
def sentence_prob(text: str, counting: bool = False) -> float:
  """P(grammar.sentence writes `text`), summed over its parses (counting: how many)."""
  words = sentence_words(text)
  return 0.0 if words is None else _Chart(words, counting).sentence()


def _pair_prob(cues, a, b) -> float:
  # rng.sample(cues, 2): an ordered pair of distinct positions, uniformly.
  k = len(cues)
  hits = sum(1 for i in range(k) for j in range(k) if i != j and (cues[i], cues[j]) == (a, b))
  return hits / (k * (k - 1))


@functools.cache
def _sense_index() -> tuple[dict, dict]:
  """cue word -> {(sense, which)}, predicate word -> {(sense, which)}: whom a sentence may cue."""
  cue_of, predicate_of = collections.defaultdict(set), collections.defaultdict(set)
  for s, sense in enumerate(g.lexicon().senses):
    for which in range(2):
      for w in sense.cues[which]:
        cue_of[w].add((s, which))
      for w in sense.predicates[which]:
        predicate_of[w].add((s, which))
  return cue_of, predicate_of


@functools.lru_cache(maxsize=1 << 16)
def _cue_probs(text: str) -> dict:
  """(sense, which) -> P(_cue_sentence(sense.cues[which]) writes `text`)."""
  words = sentence_words(text)
  if words is None or len(words) < 8:
    return {}
  chart, out, end = _Chart(words), {}, len(words) - 6
  senses = g.lexicon().senses
  tail = (words[end + 1] == "the" and words[end + 4] == "the")
  for s, which in _sense_index()[0].get(words[-1], ()) if tail else ():
    pair = _pair_prob(senses[s].cues[which], words[end + 2], words[end + 5])
    total = 0.0
    for number, p_number in _NUMBERS:
      phrase = chart.noun_phrase(0, number, 0).get((end, 0), 0.0)
      total += (p_number * phrase * chart.word(end, "verb_t", number) * pair
                * chart.word(end + 3, "prep"))
    if total:
      out[s, which] = total
  return out


@functools.lru_cache(maxsize=1 << 16)
def _sense_probs(text: str) -> dict:
  """(sense, which) -> P(_sense_sentence(sense, which) writes `text`)."""
  words = sentence_words(text)
  if words is None or len(words) < 4 or words[0] != "the":
    return {}
  chart, out, senses = _Chart(words), {}, g.lexicon().senses
  for s, which in _sense_index()[1].get(words[-1], ()):
    predicates, total = senses[s].predicates[which], 0.0
    p_predicate = predicates.count(words[-1]) / len(predicates)
    for (number, p_number), form in zip(_NUMBERS, senses[s].noun):
      if words[1] != form:
        continue
      ends = {2: 1 - P_SENSE_PP}  # where the copula sits -> probability of what precedes
      prep = chart.word(2, "prep")
      for inner, p_inner in _NUMBERS:
        for (k, _), q in chart.noun_phrase(3, inner, 0).items() if prep else ():
          ends[k] = ends.get(k, 0.0) + P_SENSE_PP * prep * p_inner * q
      copula = len(words) - 2
      if words[copula] in (g._COPULA["present"][number], g._COPULA["past"][number]):
        total += p_number * ends.get(copula, 0.0) * P_SENSE_PRESENT * p_predicate
    if total:
      out[s, which] = total
  return out


def _log(p: float) -> float:
  return math.log(p) if p > 0 else -math.inf


def split_sentences(text: str) -> list[str]:
  """The sentences of a document (words never hold '.', so '. ' separates them)."""
  parts = text.split(". ")
  return [p + "." for p in parts[:-1]] + parts[-1:]


def document_log_prob(text: str, sentences_range: tuple[int, int] = g.DOC_SENTENCES) -> float:
  """log P(grammar.document(rng, sentences_range) == text), natural log; -inf if impossible."""
  sentences = split_sentences(text)
  n, (lo, hi) = len(sentences), sentences_range
  if not lo <= n <= hi:
    return -math.inf
  log_n = -math.log(hi - lo + 1)
  log_regular = [_log(sentence_prob(s)) for s in sentences]
  if n == 1:
    return log_n + log_regular[0]
  terms = [math.log(1 - P_SENSE_DOCUMENT) + sum(log_regular)]
  cues = [_cue_probs(s) for s in sentences]
  uses = [_sense_probs(s) for s in sentences]
  log_pick = math.log(P_SENSE_DOCUMENT) - math.log(len(g.lexicon().senses)) - math.log(2)
  for c in range(n - 1):
    for q in range(c + 1, n):
      rest = sum(log_regular[i] for i in range(n) if i not in (c, q))
      if rest == -math.inf:
        continue
      # cue_at = randrange(n - 1), the use's position = randrange(cue_at + 1, n)
      log_where = log_pick - math.log(n - 1) - math.log(n - 1 - c) + rest
      for key in cues[c].keys() & uses[q].keys():
        terms.append(log_where + math.log(cues[c][key]) + math.log(uses[q][key]))
  top = max(terms)
  if top == -math.inf:
    return -math.inf
  return log_n + top + math.log(sum(math.exp(t - top) for t in terms))


def collisions() -> dict[str, set[str]]:
  """Words that more than one slot of the grammar can write, with the slots' names.

  The parser sums over all readings, so these cost exactness nothing; they are listed so
  tests (and readers) can see the ambiguity is real and handled."""
  lex, roles = g.lexicon(), collections.defaultdict(set)
  for (kind, number), words in _lexical().items():
    for w in words:
      roles[w].add(kind if number is None else f"{kind}:{number}")
  for s, sense in enumerate(lex.senses):
    for w, number in zip(sense.noun, ("sg", "pl")):
      roles[w].add(f"sense_noun:{number}")
    for which in range(2):
      for w in sense.cues[which]:
        roles[w].add(f"cue:{s}.{which}")
      for w in sense.predicates[which]:
        roles[w].add(f"predicate:{s}.{which}")
  for tense in g._COPULA.values():
    for w in tense.values():
      roles[w].add("copula")
  for w in ("that", "has", "have"):
    roles[w].add(w)
  return {w: r for w, r in roles.items() if len(r) > 1 or w == "an"}


def loss_floor(data_config, tokenizer, split: str = "validation",
               max_records: int | None = None) -> dict | None:
  """The lm loss of a perfect model on `split`, in nats per predicted token; None unless the
  dataset is grammar_corpus and the tokenizer is bytes.

  Sum over documents of -log p(document | the corpus' rules), divided by the tokens the lm
  objective predicts for them: every byte (the first one too, as BOS's target) and EOS, i.e.
  bytes + 1 per document; that -log p is exactly what a perfect model pays for those
  targets. With data.max_doc_tokens the corpus holds the documents that fit, drawn from
  p(doc) / Z (Z = P(a document fits), exact by dynamic programming over the grammar), so
  each document's -log p(doc) is lowered by -log Z. Keys: loss_floor, exact (False when a
  row of data.seq_len cuts some document of the split: a piece then lacks its context and
  the true floor is higher, so this is a lower bound), documents, tokens, cut_documents,
  max_document_tokens (the split's longest, BOS and EOS included), z, z_stderr and
  floor_stderr (0.0: Z is exact, and so is the floor on these documents). The parser sums
  over every derivation, so ambiguity costs no exactness.
  """
  from transformer.data import builders, featurize, sources, tokenizers  # pylint: disable=g-import-not-at-top
  if data_config.name != "grammar_corpus" or not isinstance(tokenizer, tokenizers.BytesTokenizer):
    return None
  sentences = builders.doc_sentences(data_config)
  cap = builders.max_doc_tokens(data_config)
  from transformer.data import grammar_lengths  # it reads this module's tables
  z = grammar_lengths.fit_probability(sentences, cap)
  records = sources.load(data_config, split)
  if max_records is not None:
    records = records[:max_records]
  nll, tokens, cut, longest, documents = 0.0, 0, 0, 0, 0
  for record in records:
    log_p = document_log_prob(record["text"], sentences)
    if log_p == -math.inf or (cap and g.document_tokens(record["text"]) > cap):
      raise ValueError(f"grammar_corpus document {documents} of {split!r} has probability 0 "
                       f"under the generator with doc_sentences={sentences}, max_doc_tokens="
                       f"{cap}: the built data does not match grammar.py; rebuild it (delete "
                       f"its data_dir copy)")
    features = featurize.lm(record, tokenizer, None, data_config)
    nll -= log_p - math.log(z)
    tokens += int(np.sum(features["weights"] > 0))
    cut += len(features["inputs"]) > data_config.seq_len
    longest = max(longest, len(features["inputs"]) + 1)
    documents += 1
  return {"loss_floor": nll / tokens, "exact": cut == 0, "documents": documents,
          "tokens": tokens, "cut_documents": cut, "max_document_tokens": longest,
          "z": z, "z_stderr": 0.0, "floor_stderr": 0.0}
