"""Lengths of grammar_corpus documents: the longest a document can be (so a row of seq_len
holds it whole), and the exact distribution of document lengths, hence Z = P(a document fits
in data.max_doc_tokens), which the loss floor of a capped corpus needs (grammar_floor.py)."""

import collections
import functools

import numpy as np

from transformer.data import grammar as g
from transformer.data.grammar_floor import (P_ADJ, P_ADVERB, P_COPULA, P_HAS, P_INTRANSITIVE,
                                            P_MODIFIER, P_OBJECT_RELATIVE, P_PP, P_PRESENT,
                                            P_SENSE_DOCUMENT, P_SENSE_PP, P_SENSE_PRESENT,
                                            P_SUBJECT_RELATIVE, P_TRANSITIVE, _NUMBERS,
                                            _lexical)


def _longest(words) -> int:
  return max(len("an" if w == "a" else w) for w in words)


def max_sentence_chars() -> int:
  """An upper bound on the characters of any sentence the generator writes (regular, cue or
  sense); tight up to number agreement, since every slot may take its longest word."""
  lex = _lexical()
  longest = {key: _longest(words) for key, words in lex.items()}
  word = lambda kind: max(v for (k, _), v in longest.items() if k == kind)
  senses = g.lexicon().senses
  copula = _longest(w for t in g._COPULA.values() for w in t.values())
  head = word("det") + 1 + word("adj") + 1 + word("noun")
  modifier = max(word("prep") + 2, len(" that ") + word("verb_t") + 1)

  def phrase(budget):
    return head + budget * (modifier + head)  # a chain: one modifier per phrase

  predicate = max(copula + 1 + word("adj"), len("have") + 1 + phrase(g._OBJECT_BUDGET),
                  word("verb_t") + 1 + phrase(g._OBJECT_BUDGET), word("verb_i") + 1 + word("adv"))
  regular = phrase(g._SUBJECT_BUDGET) + 1 + predicate + 1
  cue_word = _longest(w for s in senses for c in s.cues for w in c)
  cue = phrase(0) + 1 + word("verb_t") + len(" the ") + cue_word + 1 + word("prep") + len(
      " the ") + cue_word + 1
  sense_use = (len("the ") + _longest(w for s in senses for w in s.noun) + 1 + word("prep") + 1
               + phrase(0) + 1 + copula + 1
               + _longest(w for s in senses for p in s.predicates for w in p) + 1)
  return max(regular, cue, sense_use)


def max_document_tokens(sentences_range: tuple[int, int]) -> int:
  """The most tokens (bytes tokenizer: ASCII bytes, plus the lm featurizer's BOS and EOS) a
  document with at most sentences_range[1] sentences can have. Its lm features are one
  shorter (inputs drop EOS, targets drop BOS), so a row of seq_len holds it whole iff
  max_document_tokens - 1 <= seq_len."""
  hi = sentences_range[1]
  return hi * max_sentence_chars() + (hi - 1) + 2


# Length distributions: arrays a with a[k] = P(a part of the grammar writes k characters),
# a word counting len(word) + 1 (the space after it, or the sentence's period), so a
# sentence's characters are the sum over its words. Exact up to float rounding: every
# choice the generator makes enters with its probability, a/an included.

def _array(lengths: dict) -> np.ndarray:
  out = np.zeros(max(lengths, default=0) + 1)
  for k, p in lengths.items():
    out[k] += p
  return out


def _plus(*arrays) -> np.ndarray:
  out = np.zeros(max(len(a) for a in arrays))
  for a in arrays:
    out[:len(a)] += a
  return out


def _conv(*arrays) -> np.ndarray:
  out = np.ones(1)
  for a in arrays:
    out = np.convolve(out, a)
  return out


def _shift(a: np.ndarray, k: int) -> np.ndarray:
  return np.concatenate([np.zeros(k), a])


def _words(words: dict, vowel: bool | None = None) -> np.ndarray:
  """word -> probability, as lengths (len + 1); vowel=True/False keeps words that do/don't
  start with a vowel (what turns a preceding 'a' into 'an')."""
  lengths = collections.defaultdict(float)
  for w, p in words.items():
    if vowel is None or (w[0] in "aeiou") == vowel:
      lengths[len(w) + 1] += p
  return _array(lengths)


class _Lengths:
  """Character-length distributions of the generator's parts, by dynamic programming."""

  def __init__(self):
    self.lex = _lexical()
    self._phrases = {}

  def word(self, kind, number=None, vowel=None) -> np.ndarray:
    return _words(self.lex[kind, number], vowel)

  def det_then(self, number, kind, next_number=None) -> np.ndarray:
    """A determiner and the word after it ('a' is 'an' before a vowel)."""
    vowel, other = self.word(kind, next_number, True), self.word(kind, next_number, False)
    parts = []
    for det, p in self.lex["det", number].items():
      if det == "a":
        parts.append(p * _plus(_shift(vowel, 3), _shift(other, 2)))
      else:
        parts.append(p * _shift(_plus(vowel, other), len(det) + 1))
    return _plus(*parts)

  def head(self, number) -> np.ndarray:
    no_adj = self.det_then(number, "noun", number)
    adj = _conv(self.det_then(number, "adj"), self.word("noun", number))
    return _plus((1 - P_ADJ) * no_adj, P_ADJ * adj)

  def noun_phrase(self, number, budget) -> np.ndarray:
    """_noun_phrase(number, [budget]): one modifier at most per phrase, so the budget is
    spent down a chain and the inner phrase gets budget - 1."""
    key = (number, budget)
    if key not in self._phrases:
      head = self.head(number)
      if budget == 0:
        self._phrases[key] = head
      else:
        that = _shift(np.ones(1), len("that") + 1)
        modifiers = []
        for inner, p_inner in _NUMBERS:
          phrase = self.noun_phrase(inner, budget - 1)
          modifiers += [
              p_inner * P_PP * _conv(self.word("prep"), phrase),
              p_inner * P_OBJECT_RELATIVE * _conv(that, phrase, self.word("verb_t", inner)),
              p_inner * P_SUBJECT_RELATIVE * _conv(that, self.word("verb_t", number), phrase)]
        self._phrases[key] = _plus((1 - P_MODIFIER) * head,
                                   P_MODIFIER * _conv(head, _plus(*modifiers)))
    return self._phrases[key]

  def object_phrase(self) -> np.ndarray:
    return _plus(*(p * self.noun_phrase(n, g._OBJECT_BUDGET) for n, p in _NUMBERS))

  def predicate(self, number) -> np.ndarray:
    copula = _plus(*(p * _shift(self.word("adj"), len(g._COPULA[t][number]) + 1)
                     for t, p in (("present", P_PRESENT), ("past", 1 - P_PRESENT))))
    has = _shift(self.object_phrase(), len("has" if number == "sg" else "have") + 1)
    transitive = _conv(self.word("verb_t", number), self.object_phrase())
    adverb = _plus((1 - P_ADVERB) * np.ones(1), P_ADVERB * self.word("adv"))
    intransitive = _conv(self.word("verb_i", number), adverb)
    return _plus(P_COPULA * copula, P_HAS * has, P_TRANSITIVE * transitive,
                 P_INTRANSITIVE * intransitive)

  def sentence(self) -> np.ndarray:
    return _plus(*(p * _conv(self.noun_phrase(n, g._SUBJECT_BUDGET), self.predicate(n))
                   for n, p in _NUMBERS))

  def cue_sentence(self, cues) -> np.ndarray:
    # rng.sample(cues, 2): an ordered pair of distinct positions, uniformly.
    k, pair = len(cues), collections.defaultdict(float)
    for i in range(k):
      for j in range(k):
        if i != j:
          pair[len(cues[i]) + len(cues[j]) + 2] += 1 / (k * (k - 1))
    fixed = 2 * (len("the") + 1)
    return _plus(*(p * _shift(_conv(self.head(n), self.word("verb_t", n), _array(pair),
                                    self.word("prep")), fixed) for n, p in _NUMBERS))

  def sense_sentence(self, sense, which) -> np.ndarray:
    pp = _plus((1 - P_SENSE_PP) * np.ones(1), P_SENSE_PP * _conv(
        self.word("prep"), _plus(*(p * self.head(n) for n, p in _NUMBERS))))
    predicate = _array(collections.Counter(len(w) + 1 for w in sense.predicates[which])) / len(
        sense.predicates[which])
    parts = []
    for (number, p), noun in zip(_NUMBERS, sense.noun):
      copula = _plus(*(q * _shift(np.ones(1), len(g._COPULA[t][number]) + 1)
                       for t, q in (("present", P_SENSE_PRESENT), ("past", 1 - P_SENSE_PRESENT))))
      parts.append(p * _shift(_conv(pp, copula, predicate), len("the") + 1 + len(noun) + 1))
    return _plus(*parts)

  def document(self, sentences_range) -> np.ndarray:
    """P(grammar.document(rng, sentences_range) has k characters), k = 0, 1, ..."""
    lo, hi = sentences_range
    regular = self.sentence()
    senses = g.lexicon().senses
    pairs = None
    if hi >= 2:
      pairs = _plus(*(_conv(self.cue_sentence(s.cues[w]), self.sense_sentence(s, w))
                      for s in senses for w in range(2))) / (2 * len(senses))
    parts, power = [], [np.ones(1)]  # power[m] = regular ** m (convolution)
    for _ in range(hi):
      power.append(_conv(power[-1], regular))
    for n in range(lo, hi + 1):
      if n == 1:
        parts.append(regular)
        continue
      text = _plus((1 - P_SENSE_DOCUMENT) * power[n],
                   P_SENSE_DOCUMENT * _conv(power[n - 2], pairs))
      parts.append(_shift(text, n - 1))  # the spaces between sentences
    return _plus(*parts) / (hi - lo + 1)


@functools.cache
def document_token_distribution(sentences_range: tuple[int, int]) -> np.ndarray:
  """P(a document has k `grammar.document_tokens`) for k = 0, 1, ..., exactly (to float
  rounding): the characters' distribution shifted by BOS and EOS. Read-only (cached)."""
  out = _shift(_Lengths().document(tuple(sentences_range)), 2)
  out.flags.writeable = False
  return out


def fit_probability(sentences_range: tuple[int, int], max_tokens: int) -> float:
  """Z = P(an unconditioned document has at most max_tokens tokens); 1.0 for max_tokens=0.
  data.max_doc_tokens draws documents from p(doc) / Z on the documents that fit."""
  if not max_tokens:
    return 1.0
  return float(np.sum(document_token_distribution(sentences_range)[:max_tokens + 1]))
