"""The grain pipeline's iterator: the shuffle window, exact resume, orbax checkpointing
(transformer/data/pipeline.py)."""

import json
import re

import pytest

from helpers.tiny_run import tiny_data
from transformer import data


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
