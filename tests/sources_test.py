"""Two processes generating one built-in dataset into one data dir: the one that loses the
race to rename its copy into place reads the winner's (transformer/data/sources.py)."""

import errno
import os
import shutil

import pytest

from helpers.tiny_run import tiny_data
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
