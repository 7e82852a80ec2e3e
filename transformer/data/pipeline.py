"""The grain input pipeline: records -> tokens -> packed fixed-shape numpy batches.

    source[shard_index::shard_count]    each host reads only its own records
    .seed(seed).shuffle().repeat(n)     a new deterministic order every epoch
    .random_map(featurize)              per-example rng: seed x epoch x index
    -> split long documents into seq_len pieces
    -> (data.shuffle_window > 0) shuffle the pieces within windows of that many
    -> first-fit packing (or padding) to seq_len, with segment ids and positions
    -> batch, padding a final partial batch with empty rows (weights 0)

Every stage is a grain dataset with exact get_state/set_state, so a restored
iterator continues with exactly the batches an uninterrupted one would produce.
"""

import dataclasses
import functools

import grain
import ml_collections
import numpy as np

from transformer.data import builders
from transformer.data import featurize
from transformer.data import grammar
from transformer.data import grammar_lengths
from transformer.data import sources
from transformer.data import tokenizers


_MIN_PACKING_ROWS = 64


def default_config() -> ml_collections.ConfigDict:
  """Every data key with its default; the `data` block of an experiment config."""
  return ml_collections.ConfigDict(dict(
      name="grammar_corpus",   # built-in dataset, or a prepared TFDS catalog name ("lm1b")
      tokenizer="bytes",       # see tokenizers.TOKENIZERS
      tokenizer_path="",       # huggingface: a tokenizer.json or its folder; tiktoken: a
                               # .tiktoken ranks file (a run keeps a copy in tokenizer/)
      tokenizer_name="",       # tiktoken: an encoding (gpt2, cl100k_base) cached locally
      seq_len=256,
      packing=True,            # False: one document (piece) per row, padded
      cross_document=False,    # lm + packing: a row is one segment, attention crosses the
                               # documents packed in it (GPT-2 / Press et al. style streams)
      shuffle_window=0,        # > 0: shuffle the pieces (documents, and the seq_len pieces a
                               # long one is split into) within windows of this many, before
                               # packing, so a long document does not fill many consecutive
                               # batches; 0 keeps each document's pieces together
      read_threads=0,          # grain reader threads; 0 reads and featurizes in the one
                               # prefetch thread: least CPU (the threads' hand-offs doubled
                               # it) and the fastest on local files. Raise it for storage
                               # with latency (gs://). The data order does not depend on it
      data_dir="",             # '' -> $TFDS_DATA_DIR -> ~/tensorflow_datasets
      size="small",            # synthetic datasets: see builders.SIZES
      doc_sentences="3,7",     # grammar_corpus: "lo,hi" sentences per document; other than
                               # 3,7, validate refuses a seq_len that could cut a document
      max_doc_tokens=0,        # grammar_corpus: redraw documents of more tokens (bytes +
                               # BOS + EOS) than this; 0 = off. <= seq_len: no row cuts one
      task="copy",             # algorithmic: copy | reverse | sort | addition
      min_length=1,            # algorithmic: train/validation/test lengths
      max_length=16,
      eval_min_length=0,       # algorithmic 'test_long' split; 0 -> max_length + 1
      eval_max_length=0,       # 0 -> 2 * max_length
      num_pairs=16,            # kv_retrieval: pairs per item (the most, with min_pairs)
      min_pairs=0,             # kv_retrieval: > 0 draws each item's pairs from
                               # [min_pairs, num_pairs]
      path="",                 # text_folder: directory of .txt files
      text_key="text",         # catalog datasets: the text feature
      prompt_loss=False,       # lm on inputs/targets data: also train on the prompt tokens
      vocab_size=8000,         # sentencepiece
      tokenizer_train_chars=10_000_000,  # sentencepiece: characters of train text sampled
  ))


def validate(data_config, objective: str | None = None,
             model_vocab_size: int | None = None,
             splits: tuple[str, ...] | dict[str, str] = ()) -> None:
  """Fails fast, naming the valid choices, before anything is built or trained.

  With `model_vocab_size` (model.vocab_size) it also checks the tokenizer fits the model,
  which for sentencepiece would otherwise show only after training the tokenizer; with
  `splits` (names, or {config key: name} to name the key in errors), that the dataset has
  them and that a built-in seq2seq dataset's examples in them fit data.seq_len in bytes
  (otherwise the first batch of that split fails, perhaps only at the first eval)."""
  if data_config.tokenizer not in tokenizers.TOKENIZERS:
    raise ValueError(f"unknown tokenizer {data_config.tokenizer!r}; "
                     f"valid: {sorted(tokenizers.TOKENIZERS)}")
  needed = tokenizers.planned_vocab_size(data_config)
  if model_vocab_size is not None and needed is not None and needed > model_vocab_size:
    size_key = " (data.vocab_size)" if data_config.tokenizer == "sentencepiece" else ""
    raise ValueError(f"tokenizer {data_config.tokenizer!r} has {needed} tokens{size_key} but "
                     f"model.vocab_size is {model_vocab_size}; set "
                     f"--config.model.vocab_size={needed}")
  if data_config.seq_len < 2:
    raise ValueError(f"data.seq_len must be >= 2, got {data_config.seq_len}")
  if data_config.get("read_threads", 0) < 0:
    raise ValueError(f"data.read_threads must be >= 0 (0: read in the prefetch thread), got "
                     f"{data_config.read_threads}")
  if data_config.get("shuffle_window", 0) < 0:
    raise ValueError(f"data.shuffle_window must be >= 0 (0: off), got {data_config.shuffle_window}")
  if data_config.cross_document and (not data_config.packing or objective not in (None, "lm")):
    raise ValueError("data.cross_document needs data.packing=True and the 'lm' objective")
  if objective is not None and featurize.get_objective(objective).needs_seq2seq:
    if sources.fields(data_config) != sources.SEQ2SEQ_FIELDS:
      seq2seq = sorted(n for n, f in builders.FIELDS.items() if f == sources.SEQ2SEQ_FIELDS)
      raise ValueError(f"objective {objective!r} needs an inputs/targets dataset {seq2seq}, "
                       f"got {data_config.name!r}")
  sources.check(data_config)
  named = list(splits.items()) if isinstance(splits, dict) else [("split", s) for s in splits]
  for key, split in named:
    sources.check_split(data_config, split, key)
  splits = tuple(split for _, split in named)
  _check_whole_documents(data_config, objective)
  if objective is not None and featurize.get_objective(objective).needs_seq2seq and (
      data_config.tokenizer == "bytes"):
    for split in splits:
      longest = builders.longest_seq2seq_chars(data_config, split)
      if longest is not None and longest + 1 > data_config.seq_len:  # + EOS
        raise ValueError(f"split {split!r} of {data_config.name!r} has examples of "
                         f"{longest + 1} tokens but data.seq_len={data_config.seq_len}; raise "
                         f"data.seq_len to at least {longest + 1}")


def _check_whole_documents(data_config, objective) -> None:
  # A grammar_corpus with a chosen doc_sentences promises whole documents per row (the loss
  # floor is exact only then); the default 3,7 corpus keeps its cut rows. Bytes tokenizer
  # only: other tokenizers' lengths are not known from the grammar.
  if data_config.name != "grammar_corpus" or data_config.tokenizer != "bytes":
    return
  sentences = builders.doc_sentences(data_config)
  cap = builders.max_doc_tokens(data_config)
  if (sentences == grammar.DOC_SENTENCES and not cap) or objective not in (None, "lm", "mlm"):
    return
  longest = grammar_lengths.max_document_tokens(sentences)
  if cap:
    longest = min(longest, cap)
  # lm features drop one of BOS/EOS; mlm (and an unnamed objective) keeps both.
  needed = longest - (1 if objective == "lm" else 0)
  if needed > data_config.seq_len:
    raise ValueError(f"data.doc_sentences={data_config.doc_sentences} documents can need "
                     f"{needed} positions but data.seq_len={data_config.seq_len}, so a row "
                     f"could cut one; raise data.seq_len to at least {needed}, or set "
                     f"data.max_doc_tokens (at most data.seq_len) to redraw longer documents")


@dataclasses.dataclass(frozen=True)
class _Featurize:
  # Picklable (unlike a lambda), so grain can also run it in worker processes.
  objective: featurize.Objective
  tokenizer: object
  data_config: ml_collections.ConfigDict

  def __call__(self, record, rng):
    return self.objective.featurize(record, self.tokenizer, rng, self.data_config)


@dataclasses.dataclass(frozen=True)
class _Split(grain.experimental.FlatMapTransform):
  split: object = None
  seq_len: int = 0
  max_fan_out: int = 1 << 20

  def flat_map(self, features):
    return self.split(features, self.seq_len)


def _pad_row(features, seq_len):
  """The no-packing layout, matching what the packer emits for a one-document row."""
  row = {}
  for key, values in features.items():
    n = len(values)
    row[key] = np.pad(values, (0, seq_len - n))
    row[f"{key}_segment_ids"] = (np.arange(seq_len) < n).astype(np.int32)
    row[f"{key}_positions"] = np.where(np.arange(seq_len) < n, np.arange(seq_len), 0).astype(
        np.int32)
  return row


def _one_segment(row):
  """Packed documents become one stream: one segment, positions counting across them."""
  real = row["segment_ids"] > 0
  return {**row, "segment_ids": real.astype(np.int32),
          "positions": np.where(real, np.cumsum(real) - 1, 0).astype(np.int32)}


def _pad_batch(batch, batch_size):
  # Only the last batch of a finite pass is short; empty rows keep shapes static for jit.
  short = batch_size - len(next(iter(batch.values())))
  if short == 0:
    return batch
  return {k: np.concatenate([v, np.zeros((short,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}


def make_dataset(data_config, tokenizer, *, split, batch_size, objective, seed,
                 shard_index=0, shard_count=1, num_epochs=None) -> grain.IterDataset:
  """The pipeline as a grain IterDataset (make_iterator is iter() of this)."""
  validate(data_config, objective)
  obj = featurize.get_objective(objective)
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")
  records = sources.load(data_config, split)
  if len(records) < shard_count:
    raise ValueError(f"split {split!r} has {len(records)} records, fewer than {shard_count} shards")
  ds = records[shard_index::shard_count].seed(seed).shuffle().repeat(num_epochs)
  ds = ds.random_map(_Featurize(obj, tokenizer, data_config))
  # Reading a local record and featurizing it is light work: grain's reader threads cost
  # more CPU in hand-offs than they save (docs/performance.md), and on a CPU host every
  # millisecond of it is taken from the train step. 0 reads in the prefetch thread below.
  threads = data_config.get("read_threads", 0)
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads,
                                            prefetch_buffer_size=64 if threads else 0))
  it = grain.experimental.FlatMapIterDataset(it, _Split(obj.split, data_config.seq_len))
  if data_config.get("shuffle_window", 0) > 0:
    # A document longer than a row becomes consecutive pieces; a corpus of long files (as
    # python_stdlib) would otherwise feed one file to many batches in a row. Seeded per
    # window, with exact iterator state (the window restarts from its parent's saved state).
    it = grain.experimental.WindowShuffleIterDataset(
        it, window_size=data_config.shuffle_window, seed=seed)
  seq_len = data_config.seq_len
  if data_config.packing:
    # Rows fill up until a piece fits in none of them, so more open rows than a batch pack
    # tighter (fewer padding tokens per batch).
    it = grain.experimental.FirstFitPackIterDataset(
        it, length_struct={k: seq_len for k in obj.keys},
        num_packing_bins=max(batch_size, _MIN_PACKING_ROWS), shuffle_bins=False)
  else:
    it = it.map(functools.partial(_pad_row, seq_len=seq_len))
  it = it.map(obj.finalize)
  if data_config.cross_document:
    it = it.map(_one_segment)
  it = it.batch(batch_size, drop_remainder=False)
  it = it.map(functools.partial(_pad_batch, batch_size=batch_size))
  return grain.experimental.ThreadPrefetchIterDataset(it, prefetch_buffer_size=2)


def make_iterator(data_config, tokenizer, *, split: str, batch_size: int, objective: str,
                  seed: int, shard_index: int = 0, shard_count: int = 1,
                  num_epochs: int | None = None) -> grain.DatasetIterator:
  """An iterator of dict batches of numpy arrays with static shapes [batch_size, seq_len].

  objective 'lm':  inputs, targets, segment_ids, positions (int32), weights (float32)
  objective 'mlm': the same keys; weights mark the selected (to-predict) tokens
  objective 'seq2seq': encoder_{inputs,segment_ids,positions},
                       decoder_{inputs,targets,segment_ids,positions,weights}
  segment_ids are 1, 2, ... per packed document and 0 on padding; positions restart
  at 0 in each document. num_epochs=None repeats forever; a finite pass ends with a
  batch padded by empty rows. Save/restore with iterator_state / restore_iterator.
  """
  return iter(make_dataset(data_config, tokenizer, split=split, batch_size=batch_size,
                           objective=objective, seed=seed, shard_index=shard_index,
                           shard_count=shard_count, num_epochs=num_epochs))


def iterator_state(iterator: grain.DatasetIterator) -> dict:
  """A JSON-serializable position of the iterator (the records it has consumed)."""
  return iterator.get_state()


def restore_iterator(iterator: grain.DatasetIterator, state: dict) -> grain.DatasetIterator:
  """Moves a freshly made iterator (same config, seed and shard) to `state`."""
  iterator.set_state(state)
  return iterator


def unigram_entropy(data_config, tokenizer, split: str, max_records: int | None = None) -> float:
  """Entropy in nats/token of the unigram distribution of the lm loss's target tokens.

  A model that learned nothing but token frequencies reaches this loss; printing it
  next to the training loss shows how much context the model is using.
  """
  records = sources.load(data_config, split)
  if max_records is not None:
    records = records[:max_records]
  counts_V = np.zeros(tokenizer.vocab_size, np.int64)
  for record in records:
    features = featurize.lm(record, tokenizer, None, data_config)
    counts_V += np.bincount(features["targets"][features["weights"] > 0],
                            minlength=tokenizer.vocab_size)
  p = counts_V[counts_V > 0] / counts_V.sum()
  return float(-(p * np.log(p)).sum())
