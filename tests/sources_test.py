"""Two processes generating one built-in dataset into one data dir: the one that loses the
race to rename its copy into place reads the winner's (transformer/data/sources.py)."""

import errno
import os
import shutil

import pytest

from helpers.tiny_run import tiny_data
from transformer import data
from transformer.data import builders, sources


def _algo(data_dir):
  return tiny_data(data_dir, name="algorithmic")


def _rename_after_a_rival(monkeypatch, complete_copy, version_dir, error=None):
  """os.rename, but a rival process's complete copy lands in version_dir first: after TFDS's
  check that the destination is free, before the rename (the gap a loaded machine widens).
  With `error`, the rename fails with that errno instead."""
  real_rename = os.rename
  calls = []

  def rename(src, dst):
    if os.path.normpath(dst) == version_dir:
      calls.append(dst)
      if error is not None:
        raise OSError(error, os.strerror(error), src)
      shutil.copytree(complete_copy, dst)
    return real_rename(src, dst)

  monkeypatch.setattr(os, "rename", rename)
  return calls


def _version_dir(data_dir, config_name):
  return os.path.join(data_dir, "algorithmic", config_name,
                      str(builders.Algorithmic.VERSION))


def _config_name(data_dir):
  (name,) = os.listdir(os.path.join(data_dir, "algorithmic"))
  return name


def test_the_loser_of_the_rename_race_reads_the_winners_copy(tmp_path, monkeypatch):
  rival = str(tmp_path / "rival")
  winner = sources._builtin(_algo(rival), "validation", rival)  # pylint: disable=protected-access
  ours, name = str(tmp_path / "ours"), _config_name(rival)
  calls = _rename_after_a_rival(monkeypatch, _version_dir(rival, name), _version_dir(ours, name))
  source = sources._builtin(_algo(ours), "validation", ours)  # pylint: disable=protected-access
  assert len(calls) == 1  # our rename ran, and lost (os.rename: ENOTEMPTY)
  assert len(source) == len(winner) > 0
  assert [source[i] for i in range(len(source))] == [winner[i] for i in range(len(winner))]
  # Only the winner's copy is left: TFDS removed our incomplete one.
  assert os.listdir(os.path.join(ours, "algorithmic", name)) == [
      str(builders.Algorithmic.VERSION)]


def test_other_rename_errors_are_not_taken_for_the_race(tmp_path, monkeypatch):
  rival = str(tmp_path / "rival")
  sources._builtin(_algo(rival), "validation", rival)  # pylint: disable=protected-access
  ours = str(tmp_path / "ours")
  _rename_after_a_rival(monkeypatch, None, _version_dir(ours, _config_name(rival)),
                        error=errno.EACCES)
  with pytest.raises(PermissionError):
    sources._builtin(_algo(ours), "validation", ours)  # pylint: disable=protected-access


def test_losing_at_the_destination_check_reads_the_winners_copy(tmp_path, monkeypatch):
  """The other way to lose the race: the rival's copy lands before TFDS checks the destination,
  and the check (etils' rename) raises a FileExistsError that carries no errno."""
  rival = str(tmp_path / "rival")
  winner = sources._builtin(_algo(rival), "validation", rival)  # pylint: disable=protected-access
  ours, name = str(tmp_path / "ours"), _config_name(rival)
  version_dir = _version_dir(ours, name)
  real_rename = os.rename

  def rename(src, dst):
    if os.path.normpath(dst) == version_dir:
      shutil.copytree(_version_dir(rival, name), dst)
      raise FileExistsError(f"{dst} already exists.")
    return real_rename(src, dst)

  monkeypatch.setattr(os, "rename", rename)
  source = sources._builtin(_algo(ours), "validation", ours)  # pylint: disable=protected-access
  assert [source[i] for i in range(len(source))] == [winner[i] for i in range(len(winner))]


def test_config_data_dir_wins_over_the_environment(tmp_path, monkeypatch):
  """data.data_dir, when set, is where data is read and built; $TFDS_DATA_DIR only fills in
  for an empty one."""
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "env"))
  assert sources.data_dir(tiny_data(tmp_path / "cfg")) == str(tmp_path / "cfg")
  assert sources.data_dir(tiny_data("")) == str(tmp_path / "env")


def test_a_catalog_name_with_a_config_or_version_is_a_catalog_name(tmp_path):
  """'wmt14_translate/de-en' and 'lm1b:1.1.0' name catalog datasets (prepare them), not unknown
  ones."""
  assert sources.in_tfds_catalog("wmt14_translate/de-en:1.0.0")
  assert sources.in_tfds_catalog("lm1b:1.1.0") and not sources.in_tfds_catalog("no_such/x")
  with pytest.raises(ValueError, match=r"^'wmt14_translate/de-en' is a TFDS catalog dataset that "
                                       r"is not prepared"):
    sources.check(tiny_data(tmp_path, name="wmt14_translate/de-en"))


def test_every_part_of_a_split_expression_is_checked(tmp_path):
  """Each '+' part of a TFDS split expression, spaces around it allowed, names a split."""
  config = tiny_data(tmp_path, name="kv_retrieval", seq_len=1024)
  data.validate(config, "seq2seq", splits={"train.eval_split": "validation[:50%] + test"})
  with pytest.raises(ValueError, match="has no split 'valid'"):
    data.validate(config, "seq2seq", splits={"train.eval_split": "test+valid[:10]"})


def test_record_texts_are_every_text_field():
  """Tokenizer training and statistics read both fields of an inputs/targets record."""
  assert sources.record_texts({"inputs": "12+3", "targets": "15"}) == ["12+3", "15"]
  assert sources.record_texts({"text": "doc", "path": "a.txt"}) == ["doc"]


@pytest.mark.parametrize("split", ["validation[:0]", "validation[5:5]", "validation[:0%]"])
def test_a_slice_with_no_records_is_refused_in_one_line(data_dir, split):
  """An empty slice of a split that exists is named, not TFDS's "Paths sequence can not be of
  0 length"."""
  with pytest.raises(ValueError, match=r"^split '.*' of dataset 'kv_retrieval' is empty: "):
    sources.load(tiny_data(data_dir, name="kv_retrieval", num_pairs=2), split)
