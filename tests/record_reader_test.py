"""The range-read source serves exactly the records of the tfds source it replaces."""

import pickle

import pytest

from helpers.tiny_run import tiny_data
from transformer.data import record_reader
from transformer.data import sources


@pytest.mark.parametrize("name", ["grammar_corpus", "algorithmic"])
@pytest.mark.parametrize("split", ["train", "validation", "train[:30%]", "train[40%:45%]"])
def test_every_record_matches_the_tfds_source(data_dir, name, split):
  config = tiny_data(data_dir, name=name)
  tfds_source = sources._builtin(config, split, sources.data_dir(config))  # pylint: disable=protected-access
  source = record_reader.RangeReadSource(tfds_source)
  assert len(source) == len(tfds_source) > 0
  for i in range(len(source)):
    assert source[i] == tfds_source[i], (split, i)
  with pytest.raises(IndexError):
    source[len(source)]
  # A pickled copy (what a grain worker process gets) opens its own readers.
  copy = pickle.loads(pickle.dumps(source))
  assert copy[len(copy) - 1] == tfds_source[len(tfds_source) - 1]


def test_load_reads_through_it(data_dir):
  config = tiny_data(data_dir, name="grammar_corpus")
  records = sources.load(config, "validation")
  tfds_source = sources._builtin(config, "validation", sources.data_dir(config))  # pylint: disable=protected-access
  assert records[3]["text"] == tfds_source[3]["text"].decode("utf-8")
