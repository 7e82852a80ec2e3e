"""English-like text from a small probabilistic grammar, plus probe items.

The corpus exists to make a few linguistic phenomena measurable on a laptop:

- a Zipfian vocabulary of a few thousand word types (real words at the head,
  pronounceable pseudo-words in the tail), so frequency effects look natural;
- nested noun phrases (prepositional phrases, subject and object relative
  clauses), which put *attractor* nouns between a subject and its verb:
  "The keys to the cabinet beside the stairs are missing.";
- sense cues: an ambiguous noun ("bank") whose later predicate ("muddy" vs
  "bankrupt") is predictable only from a cue word earlier in the document
  ("river" vs "loan").

`agreement_probes` and `sense_probes` produce minimal pairs drawn from the same
lexicon and distributions as the corpus. Everything is a pure function of its
seed, so a corpus and its probes are reproducible across machines.
"""

import dataclasses
import functools
import itertools
import random

# Real words sit at the head of each Zipf distribution so samples read like English.
_NOUNS = """key cabinet stair door table box book window house car dog cat bird tree chair
lamp picture letter road bridge garden teacher student doctor farmer child man woman friend
neighbor author painter singer player guard king queen soldier sailor baker driver pilot nurse
lawyer clerk dancer hunter miner cook boy girl brother sister uncle aunt wall roof floor shelf
knife cup plate bottle basket bag coat hat shoe clock phone computer desk bed horse cow sheep
apple orange flower stone hill village city street market shop school church tower ship train
plane island forest field farm mountain lake kitchen room hall office library museum park""".split()
_IRREGULAR_PLURALS = {"child": "children", "man": "men", "woman": "women", "shelf": "shelves",
                      "knife": "knives", "city": "cities", "library": "libraries"}
_VERBS_TRANSITIVE = """see like find hold open watch follow help move carry build paint clean visit
remember admire push pull fix need want know leave bring describe""".split()
_VERBS_INTRANSITIVE = """sleep wait arrive sing smile fall work rest shine laugh run swim appear
disappear wander stay""".split()
_ADJECTIVES = """missing broken old new red blue green small large quiet loud happy sad tired
clever brave bright dark warm cold heavy light empty full famous strange careful busy lonely
hungry ready open wooden dusty clean quick slow gentle proud curious ancient modern golden
silver""".split()
_ADVERBS = """quickly slowly often rarely quietly loudly carefully happily again today always
never sometimes""".split()
_PREPOSITIONS = "to of beside near behind under above with on in from for across inside".split()
_DETERMINERS = {"sg": ("the", "a", "this", "every", "one"),
                "pl": ("the", "some", "these", "many", "two", "several")}
_DETERMINER_WEIGHTS = {"sg": (6, 3, 1, 0.5, 0.5), "pl": (6, 2, 1, 1, 0.5, 0.5)}
_COPULA = {"present": {"sg": "is", "pl": "are"}, "past": {"sg": "was", "pl": "were"}}

# (noun, plural, ((sense-1 cue nouns, sense-1 predicates), (sense-2 cues, sense-2 predicates)))
_REAL_SENSES = (
    ("bank", "banks", (("river shore fisherman canoe", "muddy flooded steep"),
                       ("money loan teller coin", "bankrupt profitable insured"))),
    ("bat", "bats", (("cave wing insect", "nocturnal furry"),
                     ("ball pitcher inning", "splintered polished"))),
    ("crane", "cranes", (("marsh feather pond", "graceful migratory"),
                         ("construction girder cable", "rusty towering"))),
    ("seal", "seals", (("beach whisker iceberg", "playful sleek"),
                       ("envelope wax document", "unbroken official"))),
    ("mouse", "mice", (("cheese trap burrow", "timid squeaky"),
                       ("cursor keyboard monitor", "wireless ergonomic"))),
    ("spring", "springs", (("blossom meadow tulip", "early mild"),
                           ("coil mattress piston", "compressed elastic"))),
)

# Nouns the modifiers of a sentence's subject NP / a predicate's object NP may add.
_SUBJECT_BUDGET = 4
_OBJECT_BUDGET = 1
_NUM_PSEUDO = {"noun": 1100, "verb_t": 250, "verb_i": 120, "adj": 550, "adv": 80}
_NUM_PSEUDO_SENSES = 34
_ZIPF_EXPONENT = 1.1
_ONSETS = "b bl br d dr f fl g gl gr k kl kr l m n p pl pr r sk sl sp st t tr v z".split()
_VOWELS = "a e i o u ai ea oo".split()
_CODAS = "b d g k l m n p r t nd nk rt lm mp".split()


@dataclasses.dataclass(frozen=True)
class Sense:
  noun: tuple[str, str]         # (singular, plural)
  cues: tuple[tuple[str, ...], tuple[str, ...]]        # per sense: cue nouns
  predicates: tuple[tuple[str, ...], tuple[str, ...]]  # per sense: predicate adjectives


@dataclasses.dataclass(frozen=True)
class Lexicon:
  nouns: tuple[tuple[str, str], ...]      # (singular, plural), most frequent first
  verbs_t: tuple[tuple[str, str], ...]    # (3rd-person singular, plural)
  verbs_i: tuple[tuple[str, str], ...]
  adjectives: tuple[str, ...]
  adverbs: tuple[str, ...]
  senses: tuple[Sense, ...]

  def word_types(self) -> set[str]:
    words = set(self.adjectives) | set(self.adverbs) | set(_PREPOSITIONS)
    for pairs in (self.nouns, self.verbs_t, self.verbs_i):
      words |= {w for pair in pairs for w in pair}
    for s in self.senses:
      words |= set(s.noun) | {w for c in s.cues for w in c} | {w for p in s.predicates for w in p}
    words |= {w for d in _DETERMINERS.values() for w in d}
    words |= {w for c in _COPULA.values() for w in c.values()} | {"that", "has", "have"}
    return words


def _plural(noun: str) -> str:
  if noun in _IRREGULAR_PLURALS:
    return _IRREGULAR_PLURALS[noun]
  return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


def _third_person(verb: str) -> str:
  if verb.endswith(("s", "x", "ch", "sh")):
    return verb + "es"
  if verb.endswith("y") and verb[-2] not in "aeiou":
    return verb[:-1] + "ies"
  return verb + "s"


@functools.cache
def lexicon() -> Lexicon:
  """The fixed lexicon; the same on every machine (seeded, no I/O)."""
  rng = random.Random("grammar-lexicon-v1")
  taken = set(_NOUNS) | set(_VERBS_TRANSITIVE) | set(_VERBS_INTRANSITIVE) | set(_ADJECTIVES)
  taken |= set(_ADVERBS) | set(_PREPOSITIONS) | {w for n, p, _ in _REAL_SENSES for w in (n, p)}
  for _, _, senses in _REAL_SENSES:
    taken |= {w for cues, preds in senses for w in (cues + " " + preds).split()}
  taken |= {_plural(n) for n in _NOUNS} | {_third_person(v) for v in _VERBS_TRANSITIVE}

  def fresh(suffix=""):
    # A stem whose own form and inflected forms are all unused: no word is two parts of speech.
    while True:
      stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 2)))
      stem += rng.choice(_CODAS) + suffix
      forms = {stem, stem + "s"}
      if not forms & taken:
        taken.update(forms)
        return stem

  def pseudo(n, suffix=""):
    return [fresh(suffix) for _ in range(n)]

  def sense_from_pseudo():
    noun = fresh()
    cues = tuple(tuple(fresh() for _ in range(3)) for _ in range(2))
    preds = tuple(tuple(fresh() for _ in range(2)) for _ in range(2))
    return Sense((noun, noun + "s"), cues, preds)

  real_senses = tuple(
      Sense((n, p), tuple(tuple(c.split()) for c, _ in s), tuple(tuple(q.split()) for _, q in s))
      for n, p, s in _REAL_SENSES)
  senses = real_senses + tuple(sense_from_pseudo() for _ in range(_NUM_PSEUDO_SENSES))
  nouns = [(n, _plural(n)) for n in _NOUNS]
  nouns += [(s, s + "s") for s in pseudo(_NUM_PSEUDO["noun"])]
  verbs_t = [(_third_person(v), v) for v in _VERBS_TRANSITIVE]
  verbs_t += [(s + "s", s) for s in pseudo(_NUM_PSEUDO["verb_t"])]
  verbs_i = [(_third_person(v), v) for v in _VERBS_INTRANSITIVE]
  verbs_i += [(s + "s", s) for s in pseudo(_NUM_PSEUDO["verb_i"])]
  adjectives = _ADJECTIVES + pseudo(_NUM_PSEUDO["adj"])
  adverbs = _ADVERBS + pseudo(_NUM_PSEUDO["adv"], suffix="ly")
  return Lexicon(tuple(nouns), tuple(verbs_t), tuple(verbs_i), tuple(adjectives),
                 tuple(adverbs), senses)


class _Zipf:
  """Samples items with probability proportional to 1 / (rank + 2.7) ** exponent."""

  def __init__(self, items):
    self.items = items
    self.cum_weights = list(itertools.accumulate(
        1.0 / (r + 2.7) ** _ZIPF_EXPONENT for r in range(len(items))))

  def __call__(self, rng: random.Random):
    return rng.choices(self.items, cum_weights=self.cum_weights)[0]


@functools.cache
def _samplers():
  lex = lexicon()
  return {"noun": _Zipf(lex.nouns), "verb_t": _Zipf(lex.verbs_t), "verb_i": _Zipf(lex.verbs_i),
          "adj": _Zipf(lex.adjectives), "adv": _Zipf(lex.adverbs), "prep": _Zipf(_PREPOSITIONS)}


def _number(rng):
  return "sg" if rng.random() < 0.55 else "pl"


def _det(rng, number):
  return rng.choices(_DETERMINERS[number], weights=_DETERMINER_WEIGHTS[number])[0]


def _noun_phrase(rng, number, budget, det=None):
  """Words of an NP; `budget` caps the nouns that modifiers may add (keeps sentences short)."""
  z = _samplers()
  words = [det or _det(rng, number)]
  if rng.random() < 0.3:
    words.append(z["adj"](rng))
  words.append(z["noun"](rng)[0 if number == "sg" else 1])
  if budget[0] > 0 and rng.random() < 0.45:
    budget[0] -= 1
    kind = rng.random()
    if kind < 0.65:    # PP: "the keys [to the cabinet]"
      words += [z["prep"](rng)] + _noun_phrase(rng, _number(rng), budget)
    elif kind < 0.85:  # object relative: "the keys [that the man holds]"
      inner = _number(rng)
      words += ["that"] + _noun_phrase(rng, inner, budget) + [_verb(rng, "verb_t", inner)]
    else:              # subject relative: "the keys [that open the door]"
      words += ["that", _verb(rng, "verb_t", number)] + _noun_phrase(rng, _number(rng), budget)
  return words


def _verb(rng, kind, number):
  return _samplers()[kind](rng)[0 if number == "sg" else 1]


def _predicate(rng, number):
  z = _samplers()
  r = rng.random()
  if r < 0.3:
    tense = "present" if rng.random() < 0.6 else "past"
    return [_COPULA[tense][number], z["adj"](rng)]
  if r < 0.4:
    return ["has" if number == "sg" else "have"] + _noun_phrase(rng, _number(rng),
                                                                [_OBJECT_BUDGET])
  if r < 0.75:
    return [_verb(rng, "verb_t", number)] + _noun_phrase(rng, _number(rng), [_OBJECT_BUDGET])
  words = [_verb(rng, "verb_i", number)]
  return words + [z["adv"](rng)] if rng.random() < 0.4 else words


def _sentence(words):
  text = " ".join("an" if w == "a" and nxt[0] in "aeiou" else w for w, nxt in zip(words, words[1:]))
  text += " " + words[-1]
  return text[:1].upper() + text[1:] + "."


def sentence(rng: random.Random) -> str:
  number = _number(rng)
  return _sentence(_noun_phrase(rng, number, [_SUBJECT_BUDGET]) + _predicate(rng, number))


def _cue_sentence(rng, cues):
  number = _number(rng)
  cue_a, cue_b = rng.sample(cues, 2)
  return _sentence(_noun_phrase(rng, number, [0]) + [_verb(rng, "verb_t", number), "the", cue_a,
                                                     _samplers()["prep"](rng), "the", cue_b])


def _sense_sentence(rng, sense, which):
  number = _number(rng)
  words = ["the", sense.noun[0 if number == "sg" else 1]]
  if rng.random() < 0.4:
    words += [_samplers()["prep"](rng)] + _noun_phrase(rng, _number(rng), [0])
  tense = "present" if rng.random() < 0.5 else "past"
  return _sentence(words + [_COPULA[tense][number], rng.choice(sense.predicates[which])])


DOC_SENTENCES = (3, 7)  # the corpus' default sentences per document (data.doc_sentences)


def document_tokens(text: str) -> int:
  """The tokens a document is under the bytes tokenizer with the lm featurizer's BOS and EOS
  (data.max_doc_tokens caps this; its lm features are one shorter)."""
  return len(text.encode()) + 2


def document(rng: random.Random, sentences_range: tuple[int, int] = DOC_SENTENCES,
             max_tokens: int = 0) -> str:
  """A short document of randint(*sentences_range) sentences (3-7 by default); half of those
  with 2+ sentences carry a sense cue and its later use (a 1-sentence one has no room).

  With max_tokens > 0, a document of more than max_tokens `document_tokens` is redrawn from
  the same rng (rejection sampling: the result is the generator conditioned on fitting);
  max_tokens=0 draws exactly what it always did."""
  while True:
    text = _document(rng, sentences_range)
    if not max_tokens or document_tokens(text) <= max_tokens:
      return text


def _document(rng, sentences_range):
  n = rng.randint(*sentences_range)
  sentences = [sentence(rng) for _ in range(n)]
  if n >= 2 and rng.random() < 0.5:
    sense = rng.choice(lexicon().senses)
    which = rng.randrange(2)
    cue_at = rng.randrange(n - 1)
    sentences[cue_at] = _cue_sentence(rng, sense.cues[which])
    sentences[rng.randrange(cue_at + 1, n)] = _sense_sentence(rng, sense, which)
  return " ".join(sentences)


@dataclasses.dataclass(frozen=True)
class AgreementProbe:
  prefix: str          # sentence start up to (not including) the verb
  correct: str         # verb form agreeing with the head noun
  wrong: str           # the same verb with the other number
  num_attractors: int  # nouns between head and verb whose number differs from the head
  distance: int        # words strictly between the head noun and the verb


def agreement_probes(num_items: int, num_attractors: int, seed: int = 0) -> list[AgreementProbe]:
  """Subject-verb agreement minimal pairs with exactly `num_attractors` (0..4) attractors.

  The subject is a head noun followed by a right-branching chain of prepositional
  phrases ("The key to the cabinets beside the doors"); each chained noun is an
  attractor, and with probability 1/2 one extra same-number noun is inserted to vary
  the distance independently of the attractor count. Determiners are all "the" so
  only the noun's own form reveals its number.
  """
  if not 0 <= num_attractors <= 4:
    raise ValueError(f"num_attractors must be in 0..4, got {num_attractors}")
  rng = random.Random(f"agreement-{seed}-{num_attractors}")
  z = _samplers()
  form = lambda noun, number: noun[0 if number == "sg" else 1]
  items = []
  for _ in range(num_items):
    head = _number(rng)
    other = "pl" if head == "sg" else "sg"
    chain = [other] * num_attractors
    if rng.random() < 0.5:
      chain.insert(rng.randint(0, len(chain)), head)
    words = ["the", form(z["noun"](rng), head)]
    head_index = len(words) - 1
    for number in chain:
      words += [z["prep"](rng), "the", form(z["noun"](rng), number)]
    verb = rng.choice([("is", "are"), ("was", "were"), ("has", "have"), z["verb_i"](rng),
                       z["verb_t"](rng)])
    correct, wrong = (verb[0], verb[1]) if head == "sg" else (verb[1], verb[0])
    prefix = " ".join(words)
    items.append(AgreementProbe(prefix[:1].upper() + prefix[1:], correct, wrong,
                                num_attractors, len(words) - head_index - 1))
  return items


@dataclasses.dataclass(frozen=True)
class SenseProbe:
  prefix: str   # cue sentence, optional filler sentences, then "The bank was"
  correct: str  # a predicate of the cued sense
  wrong: str    # a predicate of the other sense
  gap: int      # filler sentences between the cue and the ambiguous noun


def sense_probes(num_items: int, gap: int = 1, seed: int = 0) -> list[SenseProbe]:
  """Items where only a cue `gap` sentences back tells which predicate fits."""
  rng = random.Random(f"sense-{seed}-{gap}")
  items = []
  for _ in range(num_items):
    sense = rng.choice(lexicon().senses)
    which = rng.randrange(2)
    number = _number(rng)
    tense = "present" if rng.random() < 0.5 else "past"
    target = f"The {sense.noun[0 if number == 'sg' else 1]} {_COPULA[tense][number]}"
    parts = [_cue_sentence(rng, sense.cues[which])] + [sentence(rng) for _ in range(gap)]
    items.append(SenseProbe(" ".join(parts + [target]), rng.choice(sense.predicates[which]),
                            rng.choice(sense.predicates[1 - which]), gap))
  return items
