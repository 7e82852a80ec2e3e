"""transformer/data/grammar.py: the probes' items say what they claim (number agreement with
the head noun, the cued sense)."""

import re

from transformer import data
from transformer.data import grammar


def test_agreement_probes_correct_form_agrees_with_the_head():
  """The 'correct' verb has the head noun's number and 'wrong' the other; the extra same-number
  noun that varies the distance lands anywhere in the attractor chain, not only at its end."""
  lexicon = grammar.lexicon()
  number = {sg: "sg" for sg, _ in lexicon.nouns} | {pl: "pl" for _, pl in lexicon.nouns}
  singular = {"is", "was", "has"} | {sg for sg, _ in lexicon.verbs_t + lexicon.verbs_i}
  plural = {"are", "were", "have"} | {pl for _, pl in lexicon.verbs_t + lexicon.verbs_i}
  extra_at = set()
  for k in range(5):
    for item in data.agreement_probes(100, k, seed=0):
      nouns = item.prefix.lower().split()[1::3]
      head = number[nouns[0]]
      assert item.correct in (singular if head == "sg" else plural), item
      assert item.wrong in (plural if head == "sg" else singular), item
      same = [i for i, n in enumerate(nouns[1:]) if number[n] == head]
      extra_at.update((i, k) for i in same)
  assert {i for i, k in extra_at if k == 3} == {0, 1, 2, 3}


def test_sense_probes_cue_the_sense_of_the_correct_predicate():
  """The cue sentence names cue nouns of the sense whose predicate is 'correct' (none of the
  other sense's), and the prefix ends with the ambiguous noun and its copula."""
  senses = grammar.lexicon().senses
  for item in data.sense_probes(50, gap=1, seed=3):
    sense, which = next((s, w) for s in senses for w in (0, 1)
                        if item.correct in s.predicates[w] and item.wrong in s.predicates[1 - w])
    cue = set(item.prefix.split(".")[0].lower().split())
    assert cue & set(sense.cues[which]) and not cue & set(sense.cues[1 - which]), item
    assert re.search(rf"\. The ({sense.noun[0]} (is|was)|{sense.noun[1]} (are|were))$",
                     item.prefix), item.prefix
