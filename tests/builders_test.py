"""transformer/data/builders.py: held-out splits of their own, a directory per setting that
changes the records, and the python_stdlib file list."""

import pytest

from helpers.tiny_run import tiny_data
from transformer import data
from transformer.data import builders, sources


@pytest.mark.parametrize("name", ["grammar_corpus", "kv_retrieval"])
def test_held_out_splits_are_not_copies_of_train(data_dir, name):
  """Each split is drawn from its own seeds: validation and test share no record with train
  or with each other."""
  config = tiny_data(data_dir, name=name, num_pairs=3)
  texts = {s: {tuple(sources.record_texts(r)) for r in sources.load(config, s)}
           for s in ("train", "validation", "test")}
  assert len(texts["validation"]) == len(texts["test"]) == builders.SIZES["tiny"][1]
  assert not texts["validation"] & texts["train"] and not texts["test"] & texts["train"]
  assert not texts["validation"] & texts["test"]


def test_every_knob_that_changes_the_records_names_its_own_directory(tmp_path):
  """built_name (the prepared copy's directory) differs for every setting that changes a
  built-in dataset's records, so data built for one setting is never read for another."""
  cases = {"algorithmic": [dict(task="sort"), dict(min_length=2), dict(max_length=9),
                           dict(eval_min_length=20), dict(eval_max_length=40), dict(size="small")],
           "kv_retrieval": [dict(num_pairs=5), dict(min_pairs=2), dict(min_pairs=4),
                            dict(size="small")],
           "grammar_corpus": [dict(size="small"), dict(doc_sentences="1,1")]}
  for name, changes in cases.items():
    names = [data.built_name(tiny_data(tmp_path, name=name, **(dict(num_pairs=4) | c)))
             for c in [{}] + changes]
    assert len(set(names)) == len(names), names
  with pytest.raises(ValueError, match=r"data.min_pairs must be 0 \(fixed\) or in \[1, "):
    data.built_name(tiny_data(tmp_path, name="kv_retrieval", num_pairs=4, min_pairs=5))
  assert list(tmp_path.iterdir()) == []  # named from the config alone


def test_generated_stdlib_files_are_left_out():
  """Files whose first three lines say they are generated (pydoc's topics: line 2) are not
  python_stdlib records."""
  files = builders.stdlib_files()
  assert "pydoc_data/topics.py" not in files and "token.py" not in files
  assert "os.py" in files and "json/__init__.py" in files
