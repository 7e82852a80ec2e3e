"""The grain pipeline's iterator: the shuffle window, exact resume, orbax checkpointing
(transformer/data/pipeline.py)."""

import itertools
import json
import re

import numpy as np
import pytest

from helpers.tiny_run import tiny_data
from transformer import data
from transformer.data import builders, kv_retrieval, sources


def test_shuffle_window_reorders_the_pieces_and_keeps_them(data_dir):
  # seq_len 16 cuts every document into many pieces, one per row (no packing): over one epoch
  # the window keeps the same rows and breaks up each document's run of consecutive pieces.
  def rows(window):
    config = tiny_data(data_dir, seq_len=16, packing=False, shuffle_window=window)
    it = data.make_iterator(config, data.get_tokenizer(config), split="validation",
                            batch_size=64, objective="lm", seed=0, num_epochs=1)
    return [tuple(r[w > 0]) for b in it for r, w in zip(b["inputs"], b["weights"]) if w.any()]
  ordered, shuffled = rows(0), rows(256)
  assert sorted(ordered) == sorted(shuffled) and len(ordered) > 256
  bos = data.get_tokenizer(tiny_data(data_dir)).bos_id
  # In order, a row that does not start with BOS is the next piece of the row before it.
  nxt = {a: b for a, b in zip(ordered, ordered[1:]) if b[0] != bos}
  together = lambda rs: sum(nxt.get(a) == b for a, b in zip(rs, rs[1:]))
  assert together(ordered) == len(nxt) > 0.5 * len(ordered)
  assert together(shuffled) < 0.05 * len(nxt)
  with pytest.raises(ValueError, match="shuffle_window must be >= 0"):
    data.validate(tiny_data(data_dir, shuffle_window=-1))


def test_reader_threads_leave_the_batches_unchanged(data_dir):
  # read_threads only moves the reading between threads: the same seed gives the same rows.
  def batches(threads):
    config = tiny_data(data_dir, seq_len=64, read_threads=threads)
    it = data.make_iterator(config, data.get_tokenizer(config), split="train", batch_size=8,
                            objective="lm", seed=3)
    return [next(it) for _ in range(6)]
  for a, b in zip(batches(0), batches(3)):
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
  with pytest.raises(ValueError, match="read_threads must be >= 0"):
    data.validate(tiny_data(data_dir, read_threads=-1))


@pytest.mark.parametrize("objective,name,window", [
    ("lm", "grammar_corpus", 0), ("mlm", "grammar_corpus", 0), ("seq2seq", "kv_retrieval", 0),
    ("lm", "grammar_corpus", 7)])
def test_resumed_iterator_continues_exactly(data_dir, objective, name, window):
  # kv_retrieval's 100-record validation split makes the resumed stretch cross epochs; the
  # window of 7 pieces makes the saved state fall inside a window.
  config = tiny_data(data_dir, name=name, num_pairs=2, seq_len=96, shuffle_window=window)
  tokenizer = data.get_tokenizer(config)
  split = "validation" if name == "kv_retrieval" else "train"
  make = lambda: data.make_iterator(config, tokenizer, split=split, batch_size=4,
                                    objective=objective, seed=3)
  it = make()
  for _ in range(3):
    next(it)
  state = json.loads(json.dumps(data.iterator_state(it)))  # what a JSON checkpoint stores
  expected = [next(it) for _ in range(6)]
  resumed = data.restore_iterator(make(), state)
  for want in expected:
    got = next(resumed)
    assert all((got[k] == want[k]).all() for k in want)


def test_grain_orbax_handler_round_trip(data_dir, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  import grain  # pylint: disable=g-import-not-at-top

  config = tiny_data(data_dir, seq_len=64)
  tokenizer = data.get_tokenizer(config)
  make = lambda: data.make_iterator(config, tokenizer, split="train", batch_size=2,
                                    objective="lm", seed=0)
  it = make()
  next(it)
  with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    manager.wait_until_finished()
    want = next(it)
    resumed = make()
    manager.restore(1, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(resumed)))
  got = next(resumed)
  assert all((got[k] == want[k]).all() for k in want)


@pytest.mark.parametrize("name,objective,valid", [
    ("grammar_corpus", "mlm", "['train', 'validation', 'test']"),
    ("algorithmic", "seq2seq", "['train', 'validation', 'test', 'test_long']"),
    ("kv_retrieval", "seq2seq", "['train', 'validation', 'test']"),
])
def test_a_split_the_dataset_lacks_is_refused_naming_the_key(tmp_path, name, objective, valid):
  # Checked from the builder's split names alone: nothing is generated, nothing compiles.
  config = tiny_data(tmp_path, name=name, seq_len=1024)
  splits = {"train.train_split": "train", "train.eval_split": "valid"}
  want = f"train.eval_split='valid': dataset '{name}' has no split 'valid'; its splits are {valid}"
  with pytest.raises(ValueError, match=f"^{re.escape(want)}$"):
    data.validate(config, objective, splits=splits)
  data.validate(config, objective, splits={"train.eval_split": "validation[:50%]+test"})
  assert list(tmp_path.iterdir()) == []


# `import numpy as np` added to the imports) ---


def _kv_epochs(data_dir, seed, num_epochs=1):
  """Each epoch of kv_retrieval's 100 validation records as decoded documents, in order: one
  document per row and 100 rows per batch, so batch k is epoch k."""
  config = tiny_data(data_dir, name="kv_retrieval", num_pairs=2, seq_len=64, packing=False)
  tokenizer = data.get_tokenizer(config)
  it = data.make_iterator(config, tokenizer, split="validation", batch_size=100, objective="lm",
                          seed=seed, num_epochs=num_epochs)
  return [[tokenizer.decode(r[s > 0]) for r, s in zip(b["inputs"], b["segment_ids"]) if s.any()]
          for b in it]


def test_every_epoch_and_every_seed_has_its_own_order(data_dir):
  """The records are shuffled: an epoch is a permutation of the split, not its stored order;
  the next epoch has another order; the same seed gives the same order, another seed another."""
  config = tiny_data(data_dir, name="kv_retrieval", num_pairs=2, seq_len=64)
  stored = [r["inputs"] + data.PROMPT_SEPARATOR + r["targets"]
            for r in sources.load(config, "validation")]
  first, second = _kv_epochs(data_dir, seed=0, num_epochs=2)
  assert sorted(first) == sorted(second) == sorted(stored)
  assert first != stored and second != first
  assert _kv_epochs(data_dir, seed=0)[0] == first
  assert _kv_epochs(data_dir, seed=7)[0] != first


def test_the_shuffle_window_follows_the_seed(data_dir):
  """The window shuffle is seeded by the run's seed: two seeds move the pieces of their (own)
  in-order streams to different places within the first window."""
  def moves(seed):
    rows = {}
    for window in (0, 64):
      config = tiny_data(data_dir, seq_len=16, packing=False, shuffle_window=window)
      it = data.make_iterator(config, data.get_tokenizer(config), split="validation",
                              batch_size=64, objective="lm", seed=seed, num_epochs=1)
      batch = next(it)
      rows[window] = [tuple(r[w > 0]) for r, w in zip(batch["inputs"], batch["weights"])]
    unique = [r for r in rows[0] if rows[0].count(r) == 1]
    return [rows[0].index(r) for r in rows[64] if r in unique]
  a, b = moves(0), moves(1)
  assert a != sorted(a) and b != sorted(b)  # both windows shuffled
  assert a != b


def test_packing_fills_rows_even_in_small_batches(data_dir):
  """First-fit packing keeps more rows open than a batch holds (pipeline._MIN_PACKING_ROWS), so
  2-row batches of 64 tokens are still almost all document tokens."""
  config = tiny_data(data_dir, seq_len=64)
  it = data.make_iterator(config, data.get_tokenizer(config), split="train", batch_size=2,
                          objective="lm", seed=0)
  real = np.mean([(next(it)["segment_ids"] > 0).mean() for _ in range(30)])
  assert real > 0.95, real


def test_padding_has_position_zero_with_and_without_packing(data_dir):
  """Padding tokens carry segment 0 and position 0 whether the rows are packed or padded one
  document per row (pipeline._pad_row matches what the packer emits)."""
  for packing in (True, False):
    config = tiny_data(data_dir, seq_len=64, packing=packing)
    it = data.make_iterator(config, data.get_tokenizer(config), split="validation",
                            batch_size=4, objective="lm", seed=0, num_epochs=1)
    batches = list(itertools.islice(it, 8))
    pad = np.concatenate([b["positions"][b["segment_ids"] == 0] for b in batches])
    assert len(pad) and not pad.any(), packing


def test_shard_arguments_are_checked(data_dir):
  """shard_index must lie in [0, shard_count); a split may have exactly as many records as
  shards (one each), not fewer."""
  config = tiny_data(data_dir, name="kv_retrieval", num_pairs=2, seq_len=64, packing=False)
  tokenizer = data.get_tokenizer(config)
  make = lambda index, count: data.make_iterator(
      config, tokenizer, split="validation", batch_size=1, objective="lm", seed=0,
      shard_index=index, shard_count=count, num_epochs=1)
  for index, count in ((3, 3), (-1, 3)):
    with pytest.raises(ValueError, match="need 0 <= shard_index < shard_count"):
      make(index, count)
  n = builders.SIZES["tiny"][1]
  rows = [b["segment_ids"][0].any() for b in make(n - 1, n)]
  assert rows == [True]  # the last of n shards of n records: exactly one record
  with pytest.raises(ValueError, match=f"has {n} records, fewer than {n + 1} shards"):
    make(0, n + 1)


def test_seq_len_below_two_is_refused(tmp_path):
  """An lm row needs an input and its next token: data.seq_len=1 is refused up front."""
  with pytest.raises(ValueError, match="data.seq_len must be >= 2, got 1"):
    data.validate(tiny_data(tmp_path, seq_len=1))
  data.validate(tiny_data(tmp_path, seq_len=2))


def test_unigram_entropy_counts_only_the_weighted_targets(data_dir):
  """On inputs/targets data the lm loss (prompt_loss=False) predicts only the answer and EOS:
  the unigram entropy is that of those tokens, not of the prompt's."""
  config = tiny_data(data_dir, name="kv_retrieval", num_pairs=2, seq_len=64)
  tokenizer = data.get_tokenizer(config)
  counts = {}
  for record in sources.load(config, "validation"):
    for t in tokenizer.encode(record["targets"]) + [tokenizer.eos_id]:
      counts[t] = counts.get(t, 0) + 1
  p = np.array(list(counts.values())) / sum(counts.values())
  entropy = data.unigram_entropy(config, tokenizer, "validation")
  assert entropy == pytest.approx(-(p * np.log(p)).sum())


def test_validate_sizes_kv_retrieval_rows_by_their_longest_item(tmp_path):
  """kv_retrieval's items are max_chars long: a seq_len that cannot hold one and its EOS is
  refused before anything is built."""
  longest = kv_retrieval.max_chars(4)
  config = tiny_data(tmp_path, name="kv_retrieval", num_pairs=4, seq_len=longest)
  with pytest.raises(ValueError, match=f"has examples of {longest + 1} tokens"):
    data.validate(config, "seq2seq", splits=("validation",))
  config.seq_len = longest + 1
  data.validate(config, "seq2seq", splits=("validation",))
  assert list(tmp_path.iterdir()) == []
