"""Data layer: builders, tokenizers, packing, objectives, iterator state. Tiny sizes only."""

import collections
import itertools
import os
import random
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from helpers.tiny_run import tiny_data
from transformer import data
from transformer.data import builders, grammar, kv_retrieval, featurize, sources, tokenizers


def _records(config, split):
  return list(sources.load(config, split))


@pytest.mark.parametrize("name", ["grammar_corpus", "algorithmic", "kv_retrieval"])
def test_builders_are_deterministic(tmp_path, name):
  a = tiny_data(tmp_path / "a", name=name, max_length=6)
  b = tiny_data(tmp_path / "b", name=name, max_length=6)
  for split in ("train", "validation"):
    assert _records(a, split) == _records(b, split)
  assert len(sources.load(a, "train")) == builders.SIZES["tiny"][0]


_BUILD_AT_SIGNAL = """
import os, sys, time
from transformer import data
from transformer.data import sources
config = data.default_config()
config.size, config.data_dir = "tiny", sys.argv[1]
open(sys.argv[2] + "." + sys.argv[3], "w").close()
while not os.path.exists(sys.argv[2]):
  time.sleep(0.001)
records = sources.load(config, "train")
print(len(records), repr(records[0]["text"][:40]))
"""


@pytest.mark.slow
def test_processes_generating_one_dataset_at_once_share_it(tmp_path):
  # The processes of a multi-host run on one machine (or a shared disk) all generate a
  # missing built-in dataset at the same moment; the first complete copy wins and the others
  # must read it instead of failing on TFDS's rename.
  go = str(tmp_path / "go")
  procs = [subprocess.Popen([sys.executable, "-c", _BUILD_AT_SIGNAL, str(tmp_path / "tfds"), go,
                             str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
           for i in range(3)]
  deadline = time.time() + 120
  while not all(os.path.exists(f"{go}.{i}") for i in range(3)) and time.time() < deadline:
    time.sleep(0.01)
  open(go, "w").close()
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  printed = {out.strip().splitlines()[-1] for out, _ in outs}  # tfds prints progress too
  assert len(printed) == 1 and printed.pop().startswith(str(builders.SIZES["tiny"][0]))


def test_algorithmic_long_split_is_longer(data_dir):
  config = tiny_data(data_dir, name="algorithmic", task="reverse", min_length=2, max_length=5)
  short = _records(config, "train")
  long = _records(config, "test_long")
  assert all(2 <= len(r["inputs"]) <= 5 and r["targets"] == r["inputs"][::-1] for r in short)
  assert all(6 <= len(r["inputs"]) <= 10 for r in long)
  train = {r["inputs"] for r in short}  # held out: 2-letter inputs repeat in 1,000 draws
  for split in ("validation", "test"):
    assert not train & {r["inputs"] for r in _records(config, split)}


def test_python_stdlib_splits_never_share_a_file(data_dir):
  config = tiny_data(data_dir, name="python_stdlib")
  paths = {split: [r["path"] for r in _records(config, split)]
           for split in ("train", "validation", "test")}
  sets = {split: set(p) for split, p in paths.items()}
  assert all(len(p) == len(sets[s]) for s, p in paths.items())
  assert not sets["train"] & sets["validation"] and not sets["train"] & sets["test"]
  assert not sets["validation"] & sets["test"]
  everything = set().union(*sets.values())
  assert everything == set(builders.stdlib_files())
  assert not any(part in ("test", "tests", "idle_test", "site-packages")
                 for p in everything for part in p.split("/"))
  assert "encodings/cp437.py" not in everything  # generated codec table
  description = sources.describe(config)
  assert "content sha256" in description and "Python 3." in description


def test_text_folder_splits_by_path(tmp_path):
  folder = tmp_path / "texts"
  for i in range(60):
    (folder / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
    (folder / f"d{i % 3}" / f"f{i}.txt").write_text(f"document number {i}\n")
  config = tiny_data(tmp_path / "tfds", name="text_folder", path=str(folder))
  splits = {s: {r["path"] for r in _records(config, s)} for s in ("train", "validation", "test")}
  assert sum(len(p) for p in splits.values()) == 60
  assert all(builders.split_of(p) == s for s, paths in splits.items() for p in paths)


_SPLITS = ("train", "validation", "test")


@pytest.mark.parametrize("num_files", [1, 2, 3, 40])
def test_text_folder_splits_are_never_empty(tmp_path, num_files):
  # Few files leave a 5% bucket of the path-hash split empty (TFDS then refused to write it).
  folder = tmp_path / "texts"
  folder.mkdir()
  texts = {}
  for i in range(num_files):
    texts[f"doc{i}.txt"] = "\n" + "".join(f"line {j} of file {i}\n" + "\n" * (j % 2)
                                          for j in range(1 + i % 4))
    (folder / f"doc{i}.txt").write_text(texts[f"doc{i}.txt"])
  splits = [{s: sorted((r["path"], r["text"]) for r in _records(config, s))
             for s in _SPLITS}
            for config in (tiny_data(tmp_path / d, name="text_folder", path=str(folder))
                           for d in ("a", "b"))]
  assert splits[0] == splits[1]  # deterministic
  assert all(any(text.strip() for _, text in splits[0][s]) for s in _SPLITS)
  # Every character is in exactly one split, in file order (a file's parts put together).
  parts = {}
  for s in _SPLITS:
    for path, text in splits[0][s]:
      parts.setdefault(path, []).append(text)
  for path, text in texts.items():
    assert text.strip() in {"".join(p).strip() for p in itertools.permutations(parts[path])}
  visible = lambda texts: sum(len("".join(t.split())) for t in texts)
  total = visible(texts.values())
  assert visible(t for _, t in splits[0]["train"]) >= 0.75 * total or total < 60


def test_text_folder_without_text_is_a_one_line_error(tmp_path):
  blank = tmp_path / "blank"
  blank.mkdir()
  (blank / "a.txt").write_text("\n  \n")
  (tmp_path / "none").mkdir()
  cases = {str(blank): "has 0 non-whitespace character",
           str(tmp_path / "none"): "no .txt files under",
           str(tmp_path / "missing"): "is not a directory", "": "needs data.path"}
  for path, message in cases.items():
    # data.validate (the train command's check) refuses it before TFDS makes a directory.
    with pytest.raises(ValueError, match=message):
      data.validate(tiny_data(tmp_path / "tfds", name="text_folder", path=path))
  assert not os.path.exists(tmp_path / "tfds" / "text_folder")
  for path, message in cases.items():
    with pytest.raises(ValueError, match=message) as e:
      _records(tiny_data(tmp_path / "tfds", name="text_folder", path=path), "train")
    assert "\n" not in str(e.value)


def test_catalog_dataset_prepared_on_disk(tmp_path):
  class CatalogToyForDataTest(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"sentence": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(10):
        yield i, {"sentence": f"catalog sentence {i}"}

  CatalogToyForDataTest(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  config = tiny_data(tmp_path, name="catalog_toy_for_data_test", text_key="sentence")
  texts = sorted(r["text"] for r in _records(config, "train"))
  assert texts == sorted(f"catalog sentence {i}" for i in range(10))
  with pytest.raises(ValueError, match="no feature data.text_key='text'"):
    sources.load(tiny_data(tmp_path, name="catalog_toy_for_data_test"), "train")


def test_unknown_names_fail_with_valid_choices(tmp_path):
  tokenizer = data.get_tokenizer(tiny_data(tmp_path))
  cases = [
      (dict(name="no_such_data"), "lm", r"unknown dataset 'no_such_data': built-in datasets "
       r"are \['algorithmic'.*tfds build"),
      (dict(name="lm1b"), "lm", r"^'lm1b' is a TFDS catalog dataset that is not prepared under "
       r".*tfds build lm1b --data_dir=.* --file_format=array_record$"),
      (dict(name="wmt14_translate/de-en"), "lm", r"catalog dataset .*tfds build "
       r"wmt14_translate/de-en "),
      (dict(tokenizer="wordpiece"), "lm", r"valid: \['bytes', 'huggingface', 'sentencepiece', 'tiktoken'\]"),
      (dict(size="huge"), "lm", r"valid: \['tiny', 'small', 'medium', 'large'\]"),
      (dict(name="algorithmic", task="divide"), "seq2seq", r"valid: \['addition', 'copy'"),
      (dict(), "clm", r"valid: \['lm', 'mlm', 'seq2seq'\]"),
      (dict(), "seq2seq", r"inputs/targets dataset \['algorithmic', 'kv_retrieval'\]"),
  ]
  for overrides, objective, message in cases:
    config = tiny_data(tmp_path, **overrides)
    with pytest.raises(ValueError, match=message):
      data.make_iterator(config, tokenizer, split="train", batch_size=2, objective=objective,
                         seed=0)
  with pytest.raises(ValueError, match="valid:"):
    data.get_tokenizer(tiny_data(tmp_path, tokenizer="wordpiece"))
  with pytest.raises(ValueError, match="Unknown split 'nope'"):
    sources.load(tiny_data(tmp_path), "nope")


def test_bytes_tokenizer_round_trip():
  tokenizer = data.get_tokenizer(data.default_config())
  text = "Grüße, 世界!\n\tdef f(x): return x  # ✓"
  ids = tokenizer.encode(text)
  assert min(ids) >= 4 and max(ids) < tokenizer.vocab_size == 260
  assert tokenizer.decode(ids) == text
  assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.mask_id) == (0, 1, 2, 3)
  assert tokenizer.decode([1] + ids + [2, 0, 0]) == text


def test_sentencepiece_trains_once_and_round_trips(tmp_path, data_dir):
  config = tiny_data(data_dir, tokenizer="sentencepiece", vocab_size=400,
                     tokenizer_train_chars=40_000)
  workdir = tmp_path / "run"
  tokenizer = data.get_tokenizer(config, str(workdir))
  assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.mask_id) == (0, 1, 2, 3)
  [model_file] = os.listdir(workdir)
  mtime = os.stat(workdir / model_file).st_mtime_ns
  again = data.get_tokenizer(config, str(workdir))
  assert os.stat(workdir / model_file).st_mtime_ns == mtime  # reloaded, not retrained
  for text in ("The keys to the cabinet are missing.", "Grüße 世界\n\n    x = 1\t# <mask>"):
    ids = again.encode(text)
    assert again.decode(ids) == text and 3 not in ids
  sample = _records(config, "validation")[0]["text"]
  assert len(tokenizer.encode(sample)) < 0.6 * len(sample.encode())  # it learned pieces


def test_vocab_size_is_checked_before_the_tokenizer_is_trained(tmp_path):
  config = tiny_data(tmp_path / "tfds", tokenizer="sentencepiece", vocab_size=1000)
  with pytest.raises(ValueError, match=r"has 1000 tokens \(data.vocab_size\) but model.vocab_size "
                     r"is 260; set --config.model.vocab_size=1000$"):
    data.validate(config, "lm", model_vocab_size=260)
  assert not (tmp_path / "tfds").exists()  # nothing generated, nothing trained
  data.validate(config, "lm", model_vocab_size=1000)
  with pytest.raises(ValueError, match="set --config.model.vocab_size=260$"):
    data.validate(tiny_data(tmp_path), "lm", model_vocab_size=100)


def test_sentencepiece_vocab_too_small_for_the_corpus_is_a_one_line_error(tmp_path, data_dir):
  config = tiny_data(data_dir, tokenizer="sentencepiece", vocab_size=200,
                     tokenizer_train_chars=20_000)
  with pytest.raises(ValueError, match=r"cannot train data.vocab_size=200 .*smaller than "
                     r"required_chars. 200 vs \d+.*raise data.vocab_size$"):
    data.get_tokenizer(config, str(tmp_path))


def _chunks(config, tokenizer, objective, split):
  """Every piece the pipeline may place in a row, as tuples of (inputs, targets, weights)."""
  obj = featurize.get_objective(objective)
  pieces = []
  for record in sources.load(config, split):
    features = obj.featurize(record, tokenizer, np.random.default_rng(0), config)
    for piece in obj.split(features, config.seq_len):
      pieces.append(tuple(tuple(piece[k].tolist()) for k in ("inputs", "targets", "weights")))
  return pieces


@pytest.mark.parametrize("packing", [True, False])
def test_lm_rows_hold_whole_unmixed_documents(data_dir, packing):
  config = tiny_data(data_dir, seq_len=64, packing=packing)
  tokenizer = data.get_tokenizer(config)
  pieces = _chunks(config, tokenizer, "lm", "validation")
  unseen = collections.Counter(pieces)  # a count: two documents may share a short tail
  it = data.make_iterator(config, tokenizer, split="validation", batch_size=4, objective="lm",
                          seed=1, num_epochs=1)
  seen = 0
  for batch in it:
    assert set(batch) == {"inputs", "targets", "segment_ids", "positions", "weights"}
    assert all(v.shape == (4, 64) for v in batch.values())
    assert batch["inputs"].dtype == np.int32 and batch["weights"].dtype == np.float32
    pad = batch["segment_ids"] == 0
    assert not batch["weights"][pad].any() and not batch["inputs"][pad].any()
    for row in range(4):
      segments = batch["segment_ids"][row]
      ids = [s for s in np.unique(segments) if s > 0]
      assert ids == list(range(1, len(ids) + 1))
      for s in ids:
        at = np.flatnonzero(segments == s)
        assert (np.diff(at) == 1).all()  # contiguous
        assert (batch["positions"][row, at] == np.arange(len(at))).all()
        piece = tuple(tuple(batch[k][row, at].tolist()) for k in ("inputs", "targets", "weights"))
        assert unseen[piece] > 0  # exactly one document's piece, nothing mixed in
        unseen[piece] -= 1
        seen += 1
      if not packing:
        assert len(ids) <= 1
  assert seen == len(pieces) and not +unseen  # one epoch: every piece exactly once


def test_lm_prompt_loss_only_on_targets(data_dir):
  config = tiny_data(data_dir, name="kv_retrieval", num_pairs=3, seq_len=64)
  tokenizer = data.get_tokenizer(config)
  batch = next(data.make_iterator(config, tokenizer, split="train", batch_size=2, objective="lm",
                                  seed=0))
  row_targets = batch["targets"][0][batch["weights"][0] > 0]
  text = tokenizer.decode(row_targets)
  assert text.startswith("v") and "?" not in text and ":" not in text


def test_mlm_masking_proportions(data_dir):
  config = tiny_data(data_dir, seq_len=128)
  tokenizer = data.get_tokenizer(config)
  it = data.make_iterator(config, tokenizer, split="train", batch_size=16, objective="mlm", seed=0)
  real = selected = masked = randomized = kept = 0
  for _ in range(12):
    batch = next(it)
    is_real = (batch["segment_ids"] > 0) & (batch["targets"] >= 4)
    chosen = batch["weights"] > 0
    assert not (chosen & ~is_real).any()  # never pad, BOS or EOS
    real += is_real.sum()
    selected += chosen.sum()
    masked += (chosen & (batch["inputs"] == tokenizer.mask_id)).sum()
    kept += (chosen & (batch["inputs"] == batch["targets"])).sum()
    random_BL = chosen & (batch["inputs"] != batch["targets"]) & (
        batch["inputs"] != tokenizer.mask_id)
    randomized += random_BL.sum()
    assert (batch["inputs"][random_BL] >= tokenizers.NUM_SPECIAL).all()  # no BOS, EOS, mask
    assert (batch["inputs"][~chosen] == batch["targets"][~chosen]).all()
  assert selected > 3000
  assert abs(selected / real - 0.15) < 0.01
  assert abs(masked / selected - 0.8) < 0.03
  assert abs(randomized / selected - 0.1) < 0.02
  assert abs(kept / selected - 0.1) < 0.02
  again = next(data.make_iterator(config, tokenizer, split="train", batch_size=16,
                                  objective="mlm", seed=0))
  first = next(data.make_iterator(config, tokenizer, split="train", batch_size=16,
                                  objective="mlm", seed=0))
  assert all((again[k] == first[k]).all() for k in first)


@pytest.mark.parametrize("packing", [True, False])
def test_seq2seq_batches(data_dir, packing):
  config = tiny_data(data_dir, name="algorithmic", task="sort", max_length=8, seq_len=32,
                     packing=packing)
  tokenizer = data.get_tokenizer(config)
  batch = next(data.make_iterator(config, tokenizer, split="train", batch_size=3,
                                  objective="seq2seq", seed=0))
  assert set(batch) == {"encoder_inputs", "encoder_segment_ids", "encoder_positions",
                        "decoder_inputs", "decoder_targets", "decoder_segment_ids",
                        "decoder_positions", "decoder_weights"}
  assert all(v.shape == (3, 32) for v in batch.values())
  for row in range(3):
    enc_ids, dec_ids = batch["encoder_segment_ids"][row], batch["decoder_segment_ids"][row]
    assert set(np.unique(enc_ids)) == set(np.unique(dec_ids))
    for s in set(np.unique(enc_ids)) - {0}:
      source = tokenizer.decode(batch["encoder_inputs"][row][enc_ids == s])
      dec_in = batch["decoder_inputs"][row][dec_ids == s]
      dec_out = batch["decoder_targets"][row][dec_ids == s]
      assert dec_in[0] == tokenizer.bos_id and dec_out[-1] == tokenizer.eos_id
      assert (dec_in[1:] == dec_out[:-1]).all()
      assert tokenizer.decode(dec_out) == "".join(sorted(source))
    assert not batch["decoder_weights"][row][dec_ids == 0].any()
  with pytest.raises(ValueError, match="raise data.seq_len"):
    next(data.make_iterator(tiny_data(data_dir, name="algorithmic", task="sort", max_length=8,
                                      seq_len=4), tokenizer, split="train", batch_size=3,
                            objective="seq2seq", seed=0))


def test_shards_are_disjoint_and_cover_the_split(data_dir):
  config = tiny_data(data_dir, name="kv_retrieval", num_pairs=3, seq_len=64, packing=False)
  tokenizer = data.get_tokenizer(config)
  docs = []
  for shard in range(3):
    texts = []
    for batch in data.make_iterator(config, tokenizer, split="validation", batch_size=8,
                                    objective="lm", seed=0, shard_index=shard, shard_count=3,
                                    num_epochs=1):
      texts += [tokenizer.decode(row[seg > 0]) for row, seg in
                zip(batch["inputs"], batch["segment_ids"]) if seg.any()]
    docs.append(texts)
  all_records = {r["inputs"] + featurize.PROMPT_SEPARATOR + r["targets"]
                 for r in _records(config, "validation")}
  assert sum(map(len, docs)) == len(all_records) == builders.SIZES["tiny"][1]
  assert set().union(*map(set, docs)) == all_records
  assert not set(docs[0]) & set(docs[1]) and not set(docs[1]) & set(docs[2])


def test_unigram_entropy_matches_direct_count(data_dir):
  config = tiny_data(data_dir)
  tokenizer = data.get_tokenizer(config)
  entropy = data.unigram_entropy(config, tokenizer, "validation")
  counts = {}
  for record in _records(config, "validation"):
    for t in tokenizer.encode(record["text"]) + [tokenizer.eos_id]:
      counts[t] = counts.get(t, 0) + 1
  p = np.array(list(counts.values())) / sum(counts.values())
  assert entropy == pytest.approx(-(p * np.log(p)).sum())
  assert 2.0 < entropy < np.log(260)


def test_agreement_probes_count_attractors():
  lexicon = grammar.lexicon()
  number = {sg: "sg" for sg, _ in lexicon.nouns} | {pl: "pl" for _, pl in lexicon.nouns}
  for k in range(5):
    for item in data.agreement_probes(20, k, seed=0):
      words = item.prefix.lower().split()
      assert item.num_attractors == k and item.distance == len(words) - 2
      assert item.correct != item.wrong
      nouns = words[1::3]  # "the N (prep the N)*"
      assert sum(number[n] != number[nouns[0]] for n in nouns[1:]) == k
  with pytest.raises(ValueError, match="0..4"):
    data.agreement_probes(1, 5)
  assert 2000 < len(lexicon.word_types()) < 10000


def test_sense_probes_and_kv_items():
  for item in data.sense_probes(10, gap=2):
    assert item.correct != item.wrong and item.prefix.count(".") == 3
  for position in (0, 5, 9):
    for inputs, target in kv_retrieval.items(10, position, 5):
      pairs, query = inputs.split(" ? ")
      pairs = pairs.split()
      assert len(pairs) == 10 and pairs[position] == f"{query}:{target}"
  assert data.kv_items(4, 1, 3, seed=7) == data.kv_items(4, 1, 3, seed=7)
  text = grammar.document(random.Random(0))
  assert text.endswith(".") and text[0].isupper()


def test_cross_document_rows_are_one_stream(tmp_path):
  cfg = data.default_config()
  cfg.update(data_dir=str(tmp_path), size="tiny", seq_len=1024, cross_document=True)
  tok = data.get_tokenizer(cfg, None)
  batch = next(data.make_iterator(cfg, tok, split="train", batch_size=4, objective="lm", seed=0))
  real = batch["segment_ids"] > 0
  assert set(np.unique(batch["segment_ids"])) <= {0, 1}
  for row in range(4):
    n = int(real[row].sum())
    assert real[row, :n].all()  # padding only at the end
    np.testing.assert_array_equal(batch["positions"][row, :n], np.arange(n))
  # Several documents share a row: BOS appears inside it, not only at position 0.
  assert (batch["inputs"][:, 1:] == tok.bos_id).any()
  cfg.packing = False
  with pytest.raises(ValueError, match="cross_document needs"):
    data.validate(cfg, "lm")

