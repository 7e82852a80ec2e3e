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
from transformer.data import builders, grammar as g, grammar_floor as floor, pipeline, tokenizers
from transformer.data import grammar_lengths as lengths_mod

from helpers import grammar_enumeration as exhaustive


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
  probs, counts = exhaustive.by_string(exhaustive.derivations(g.sentence))
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
  probs, _ = exhaustive.by_string(
      exhaustive.derivations(lambda rng: tuple(g._noun_phrase(rng, "sg", [2]))))
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
    probs, counts = exhaustive.by_string(
        exhaustive.derivations(lambda rng: g.document(rng, sentences)))
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
  probs, counts = exhaustive.by_string(exhaustive.derivations(g.sentence))
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
    rng = exhaustive.Recording(seed)
    text = g.sentence(rng)
    p = floor.sentence_prob(text)
    assert p >= rng.prob * (1 - 1e-9), text
    if floor.sentence_prob(text, counting=True) == 1:
      assert p == pytest.approx(rng.prob, rel=1e-9), text
  for seed in range(20):
    for sentences in ((3, 7), (1, 1), (2, 3)):
      rng = exhaustive.Recording(seed)
      text = g.document(rng, sentences)
      # The recorded derivation includes the two sentences the cue pair replaced: a bound.
      assert floor.document_log_prob(text, sentences) >= math.log(rng.prob) - 1e-9, text
  assert {"open", "clean"} <= set(floor.collisions())


def test_validate_refuses_rows_that_could_cut_a_document():
  config = data.default_config()
  config.doc_sentences = "1,1"
  longest = lengths_mod.max_document_tokens((1, 1))
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



def _length_dist(derivations, offset=0):
  out = collections.defaultdict(float)
  for text, p in derivations:
    out[len(text) + offset] += p
  return out


def _rendered(words):
  # The characters words take in a sentence (a/an rendered, a space or period after each).
  return g._sentence(list(words) + ["x"])[:-3]


def _matches(array, dist):
  assert math.isclose(sum(dist.values()), 1.0, rel_tol=1e-12)
  assert math.isclose(float(np.sum(array)), 1.0, rel_tol=1e-12)
  for k in range(max(len(array), max(dist) + 1)):
    got = float(array[k]) if k < len(array) else 0.0
    assert got == pytest.approx(dist.get(k, 0.0), abs=1e-13), k


def test_length_distributions_match_exhaustive_enumeration(tiny):
  # Character counts of every part, a/an ("an open") and the shared modifier budget included.
  lexicon = tiny()
  lengths = lengths_mod._Lengths()
  _matches(lengths.sentence(), _length_dist(exhaustive.derivations(g.sentence)))
  sense = lexicon.senses[0]
  for which in range(2):
    _matches(lengths.cue_sentence(sense.cues[which]),
             _length_dist(exhaustive.derivations(
                 lambda rng: g._cue_sentence(rng, sense.cues[which]))))
    _matches(lengths.sense_sentence(sense, which),
             _length_dist(exhaustive.derivations(lambda rng: g._sense_sentence(rng, sense, which))))
  tiny(nouns=(("door", "doors"),), object_budget=1)
  lengths = lengths_mod._Lengths()
  for number in ("sg", "pl"):
    phrase = exhaustive.derivations(lambda rng: _rendered(g._noun_phrase(rng, number, [2])))
    _matches(lengths.noun_phrase(number, 2), _length_dist(phrase, offset=1))
    predicate = exhaustive.derivations(lambda rng: _rendered(g._predicate(rng, number)))
    _matches(lengths.predicate(number), _length_dist(predicate, offset=1))


def test_fit_probability_is_the_brute_force_mass_of_the_documents_that_fit(tiny):
  tiny()
  derivations = exhaustive.derivations(lambda rng: g.document(rng, (1, 1)))
  probs, _ = exhaustive.by_string(derivations)
  tokens = _length_dist(derivations, offset=2)
  _matches(lengths_mod.document_token_distribution((1, 1)), tokens)
  for cap in sorted(tokens)[::3] + [max(tokens), 0]:
    brute = sum(p for text, p in probs.items() if not cap or g.document_tokens(text) <= cap)
    assert lengths_mod.fit_probability((1, 1), cap) == pytest.approx(brute, rel=1e-12), cap
  # Conditioning: p(doc) / Z sums to 1 over the documents that fit.
  cap = sorted(tokens)[len(tokens) // 2]
  z = lengths_mod.fit_probability((1, 1), cap)
  fits = [text for text in probs if g.document_tokens(text) <= cap]
  assert 0 < z < 1
  assert sum(math.exp(floor.document_log_prob(t, (1, 1))) / z
             for t in fits) == pytest.approx(1.0, rel=1e-9)


def test_document_lengths_compose_sentences_spaces_and_the_sense_pair(tiny, monkeypatch):
  # Stub sentences (as in the document-probability test) make multi-sentence documents
  # enumerable; the stubs' lengths go into the DP as its sentence distributions.
  lexicon = tiny()
  senses = lexicon.senses + (g.Sense(("x", "xs"), (("y", "z"), ("w", "v")), (("u",), ("t",))),)
  monkeypatch.setattr(g, "lexicon", lambda: g.Lexicon(*dataclass_fields(lexicon)[:-1], senses))
  regular = {"Aa.": 0.7, "Bbbb.": 0.3}
  cue = {(0, 0): {"C.": 0.6, "Aa.": 0.4}, (0, 1): {"Cccccc.": 1.0},
         (1, 0): {"Dd.": 1.0}, (1, 1): {"Dd.": 0.5, "Bbbb.": 0.5}}
  use = {(0, 0): {"Ee.": 1.0}, (0, 1): {"F.": 0.2, "Eeeeeeeee.": 0.8}, (1, 0): {"Ee.": 1.0},
         (1, 1): {"Gggg.": 1.0}}
  pick = lambda rng, dist: rng.choices(list(dist), weights=list(dist.values()))[0]
  key = lambda sense, which: (senses.index(sense), which)
  cue_of = lambda cues: next(k for k in cue if senses[k[0]].cues[k[1]] == cues)
  monkeypatch.setattr(g, "sentence", lambda rng: pick(rng, regular))
  monkeypatch.setattr(g, "_cue_sentence", lambda rng, cues: pick(rng, cue[cue_of(cues)]))
  monkeypatch.setattr(g, "_sense_sentence", lambda rng, s, w: pick(rng, use[key(s, w)]))
  as_array = lambda dist: lengths_mod._array(_length_dist(dist.items()))
  monkeypatch.setattr(lengths_mod._Lengths, "sentence", lambda self: as_array(regular))
  monkeypatch.setattr(lengths_mod._Lengths, "cue_sentence",
                      lambda self, cues: as_array(cue[cue_of(cues)]))
  monkeypatch.setattr(lengths_mod._Lengths, "sense_sentence",
                      lambda self, s, w: as_array(use[key(s, w)]))
  for sentences in ((1, 4), (2, 2), (3, 3)):
    derivations = exhaustive.derivations(lambda rng: g.document(rng, sentences))
    _matches(lengths_mod._Lengths().document(sentences), _length_dist(derivations))


def test_fit_probability_of_the_real_grammar_matches_sampling():
  floor.clear_caches()
  num, cap = 20_000, 128
  for sentences in ((1, 1), (2, 3)):
    z = lengths_mod.fit_probability(sentences, cap)
    sampled = np.mean([g.document_tokens(g.document(random.Random(f"z{i}"), sentences)) <= cap
                       for i in range(num)])
    assert abs(sampled - z) < 4 * math.sqrt(z * (1 - z) / num), sentences
  assert lengths_mod.fit_probability((1, 1), 0) == 1.0
  assert lengths_mod.fit_probability((1, 1), 2) == 0.0
  assert len(lengths_mod.document_token_distribution((1, 1))) <= lengths_mod.max_document_tokens((1, 1)) + 1


def test_max_doc_tokens_redraws_from_the_same_stream_and_names_its_own_directory():
  for i in range(200):
    rng = random.Random(f"grammar/train/{i}")
    while g.document_tokens(text := g.document(rng, (1, 1))) > 60:
      pass
    assert g.document(random.Random(f"grammar/train/{i}"), (1, 1), 60) == text
  config = data.default_config()
  default_model = tokenizers.sentencepiece_path(config, "cache")
  config.max_doc_tokens = 128
  assert builders.GrammarCorpus.config_from(config).name == "small-maxtokens128"
  assert tokenizers.sentencepiece_path(config, "cache") != default_model  # its own tokenizer
  config.doc_sentences = "1,1"
  assert builders.GrammarCorpus.config_from(config).name == "small-sentences1-1-maxtokens128"
  config.max_doc_tokens = 5  # shorter than any document: redrawing would never end
  with pytest.raises(ValueError, match="max_doc_tokens=5"):
    builders.GrammarCorpus.config_from(config)
  config.max_doc_tokens = -1
  with pytest.raises(ValueError, match="max_doc_tokens"):
    builders.GrammarCorpus.config_from(config)


def test_validate_accepts_a_document_cap_that_fits_the_rows():
  config = data.default_config()
  config.update(doc_sentences="1,1", seq_len=128)
  with pytest.raises(ValueError, match="or set data.max_doc_tokens"):
    pipeline.validate(config, "lm")
  config.max_doc_tokens = 129  # lm features are one shorter than the document's tokens
  pipeline.validate(config, "lm")
  with pytest.raises(ValueError, match="at least 129"):
    pipeline.validate(config, "mlm")
  config.max_doc_tokens = 128
  pipeline.validate(config, "mlm")
  config.update(doc_sentences="3,7", max_doc_tokens=200)  # the cap applies to 3,7 too
  with pytest.raises(ValueError, match="at least 199"):
    pipeline.validate(config, "lm")


def test_loss_floor_under_a_document_cap_adds_log_z(tmp_path):
  config = data.default_config()
  config.update(size="tiny", data_dir=str(tmp_path), doc_sentences="1,1", seq_len=128,
                max_doc_tokens=60)
  tokenizer = data.get_tokenizer(config)
  result = floor.loss_floor(config, tokenizer, max_records=80)
  texts = [r["text"] for r in data.load(config, "validation")][:80]
  assert max(g.document_tokens(t) for t in texts) <= 60 and result["exact"]
  z = lengths_mod.fit_probability((1, 1), 60)
  assert result["z"] == z and 0.5 < z < 0.95
  assert result["z_stderr"] == 0.0 and result["floor_stderr"] == 0.0
  nll = -sum(floor.document_log_prob(t, (1, 1)) - math.log(z) for t in texts)
  assert result["loss_floor"] == pytest.approx(nll / result["tokens"], rel=1e-12)
  description = data.describe(config)  # the dataset's info states Z and the floor
  assert f"Z = {z:.10f}" in description
  assert f"{floor.loss_floor(config, tokenizer)['loss_floor']:.6f} nats/token (exact)" in (
      description)


def test_loss_floor_reports_the_longest_document_with_bos_and_eos(tmp_path):
  """loss_floor's max_document_tokens is the split's longest document in
  grammar.document_tokens (bytes + BOS + EOS)."""
  config = data.default_config()
  config.update(size="tiny", data_dir=str(tmp_path), doc_sentences="1,1", seq_len=400)
  result = floor.loss_floor(config, data.get_tokenizer(config), max_records=30)
  texts = [r["text"] for r in data.load(config, "validation")][:30]
  assert result["max_document_tokens"] == max(len(t.encode()) + 2 for t in texts)
  assert result["max_document_tokens"] == max(g.document_tokens(t) for t in texts)


@pytest.mark.parametrize("sentences", [(1, 1), (2, 3), (3, 7)])
def test_max_document_tokens_is_hi_longest_sentences_joined_plus_bos_eos(sentences):
  """The bound is a document of hi longest sentences joined by spaces, under
  grammar.document_tokens (bytes + BOS + EOS); and it bounds the exact distribution."""
  hi, m = sentences[1], lengths_mod.max_sentence_chars()
  assert lengths_mod.max_document_tokens(sentences) == g.document_tokens(" ".join(["x" * m] * hi))
  dist = lengths_mod.document_token_distribution(sentences)
  assert np.nonzero(dist)[0].max() <= lengths_mod.max_document_tokens(sentences)
