"""One process's share of the batch stream (transformer/data/shards.py): the same global batch on
any process count that divides train.data_shards, and a checkpointed position resumed only into a
stream cut into as many shards."""

import ml_collections
import numpy as np
import pytest

from helpers.tiny_run import tiny_data
from transformer import data


def _sharded(config, tokenizer, monkeypatch, processes, process, num_shards):
  from transformer.data import shards
  monkeypatch.setattr(shards.jax, "process_count", lambda: processes)
  monkeypatch.setattr(shards.jax, "process_index", lambda: process)
  return shards.ShardedBatches(config, tokenizer, split="train", objective="lm", seed=0,
                               num_shards=num_shards)


def test_sharded_stream_resumes_only_on_the_shards_it_was_cut_into(data_dir, monkeypatch):
  """A fixed train.data_shards gives one global batch on any process count; the default (one
  shard per process) does not, so its checkpointed positions must not resume on another."""
  config = ml_collections.ConfigDict(dict(data=tiny_data(data_dir, seq_len=32),
                                          train=dict(batch_size=4)))
  tokenizer = data.get_tokenizer(config.data)

  def global_batch(processes, num_shards):
    parts = [next(_sharded(config, tokenizer, monkeypatch, processes, p, num_shards))
             for p in range(processes)]
    return np.concatenate([b["inputs"] for b in parts])

  np.testing.assert_array_equal(global_batch(1, 2), global_batch(2, 2))
  assert not np.array_equal(global_batch(1, 0), global_batch(2, 0))
  states = {}
  for p in range(2):  # saved by two processes with the default: two shards
    stream = _sharded(config, tokenizer, monkeypatch, 2, p, 0)
    next(stream)
    states.update(stream.get_state())
  with pytest.raises(ValueError, match="resume it on 2 processes"):
    _sharded(config, tokenizer, monkeypatch, 1, 0, 0).set_state(states)
  one = _sharded(config, tokenizer, monkeypatch, 1, 0, 2)  # the same stream, on one process
  one.set_state(states)
  straight = _sharded(config, tokenizer, monkeypatch, 1, 0, 2)
  next(straight)
  np.testing.assert_array_equal(next(one)["inputs"], next(straight)["inputs"])


def test_each_process_takes_its_own_run_of_shards(data_dir, monkeypatch):
  """With several shards per process, process p owns shards p*k .. p*k+k-1: one process with 4
  shards, two with 2 each and four with 1 each feed the same global batch."""
  config = ml_collections.ConfigDict(dict(data=tiny_data(data_dir, seq_len=32),
                                          train=dict(batch_size=8)))
  tokenizer = data.get_tokenizer(config.data)
  streams = {processes: [_sharded(config, tokenizer, monkeypatch, processes, p, 4)
                         for p in range(processes)] for processes in (1, 2, 4)}
  assert [s.shard_ids for s in streams[2]] == [[0, 1], [2, 3]]
  batches = {n: np.concatenate([next(s)["inputs"] for s in ss]) for n, ss in streams.items()}
  np.testing.assert_array_equal(batches[1], batches[2])
  np.testing.assert_array_equal(batches[1], batches[4])


def test_shard_counts_that_do_not_divide_are_refused(data_dir, monkeypatch):
  """train.data_shards must be a multiple of the process count and divide the batch; a
  position saved under other shard ids is refused."""
  config = ml_collections.ConfigDict(dict(data=tiny_data(data_dir, seq_len=32),
                                          train=dict(batch_size=4)))
  tokenizer = data.get_tokenizer(config.data)
  with pytest.raises(ValueError, match="data_shards=3 is not a multiple of the 2 processes"):
    _sharded(config, tokenizer, monkeypatch, 2, 0, 3)
  with pytest.raises(ValueError, match="batch_size=4 is not divisible by train.data_shards=8"):
    _sharded(config, tokenizer, monkeypatch, 1, 0, 8)
  stream = _sharded(config, tokenizer, monkeypatch, 1, 0, 2)
  states = stream.get_state()
  with pytest.raises(ValueError, match=r"no data position for shards \[1\]"):
    stream.set_state({"0": states["0"], "7": states["1"]})
