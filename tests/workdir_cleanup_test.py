"""A failed first run leaves nothing it created (the workdir and the parents it made for it)
and removes nothing that existed before (issue 23)."""

import os

import pytest

from helpers import tiny_run
from transformer.training import loop, workdir_cleanup, workdir_lock


def test_missing_folders_are_the_workdir_and_its_missing_parents(tmp_path):
  assert workdir_cleanup.missing_folders(str(tmp_path / "a" / "b")) == [
      str(tmp_path / "a" / "b"), str(tmp_path / "a")]
  assert workdir_cleanup.missing_folders(str(tmp_path)) == []


def test_a_parent_something_else_wrote_to_meanwhile_stays(tmp_path):
  made = workdir_cleanup.missing_folders(str(tmp_path / "a" / "b" / "run"))
  os.makedirs(made[0])
  (tmp_path / "a" / "other.txt").write_text("not the run's")
  assert workdir_cleanup.remove_if_empty_handed(made)
  assert sorted(os.listdir(tmp_path / "a")) == ["other.txt"]


def test_results_are_never_removed(tmp_path):
  made = workdir_cleanup.missing_folders(str(tmp_path / "a" / "run"))
  os.makedirs(made[0])
  (tmp_path / "a" / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
  assert not workdir_cleanup.remove_if_empty_handed(made)
  assert (tmp_path / "a" / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("where", ["model", "first_batch"])
def test_a_failed_first_run_removes_the_folders_it_made_and_only_those(tmp_path, data_dir,
                                                                       monkeypatch, where):
  def fail(*args, **kwargs):
    raise ValueError("not today")
  if where == "model":  # before anything is written
    monkeypatch.setattr(loop.models, "make_model", fail)
  else:  # after config.json and the empty logs
    monkeypatch.setattr(loop.ShardedBatches, "__next__", fail)
  (tmp_path / "existing").mkdir()
  (tmp_path / "existing" / "keep.txt").write_text("the user's")
  before = sorted(str(p) for p in tmp_path.rglob("*"))
  for workdir in (tmp_path / "existing" / "new" / "deeper" / "run", tmp_path / "existing",
                  tmp_path / "fresh"):
    with pytest.raises(ValueError, match="not today"):
      loop.train_and_evaluate(tiny_run.tiny_config(data_dir), str(workdir))
  assert sorted(str(p) for p in tmp_path.rglob("*")
                if not p.name.startswith(".lock")) == before


def test_a_trainer_the_lock_turns_away_removes_nothing(tmp_path, data_dir, monkeypatch):
  """Another trainer takes the new workdir between this one's look at it and its lock: what the
  holder wrote stays, and a file given as --workdir is one line."""
  from transformer.training import workdir_lock
  workdir = tmp_path / "run"
  holder = workdir_lock.WorkdirLock(str(workdir))
  prepare = loop.prepare_workdir

  def the_other_trainer_first(path):
    prepare(path)
    holder.acquire()
    (workdir / "config.json").write_text("the holder's")
  monkeypatch.setattr(loop, "prepare_workdir", the_other_trainer_first)
  with pytest.raises(ValueError, match="in use by another trainer"):
    loop.train_and_evaluate(tiny_run.tiny_config(data_dir), str(workdir))
  assert (workdir / "config.json").read_text() == "the holder's"
  holder.release()
  (tmp_path / "notes").write_text("the user's")
  with pytest.raises(ValueError, match="is a file; give a directory"):
    loop.train_and_evaluate(tiny_run.tiny_config(data_dir), str(tmp_path / "notes"))


def test_what_another_process_wrote_during_a_failed_first_run_stays(tmp_path, data_dir,
                                                                     monkeypatch):
  # --workdir runs (the subfolder forgotten) while a launcher makes runs/<run> in it: the
  # failed run removes its own files only, and a folder it made stays if it holds another's.
  workdir = {}

  def fail(*args, **kwargs):
    os.makedirs(workdir["path"] / "other_run" / "checkpoints" / "100")
    (workdir["path"] / "notes.txt").write_text("the user's")
    raise ValueError("not today")
  monkeypatch.setattr(loop.ShardedBatches, "__next__", fail)
  (tmp_path / "runs").mkdir()
  for path in (tmp_path / "runs", tmp_path / "new"):
    workdir["path"] = path
    with pytest.raises(ValueError, match="not today"):
      loop.train_and_evaluate(tiny_run.tiny_config(data_dir), str(path))
    assert sorted(p.name for p in path.iterdir() if p.name != ".lock") == [
        "notes.txt", "other_run"]
    assert (path / "other_run" / "checkpoints" / "100").is_dir()
  assert all(workdir_cleanup.is_run_entry(n) for n in (
      "config.json", "config.2.json", "metrics.jsonl.tmp", ".write_test.123", "tensorboard"))
  assert not any(workdir_cleanup.is_run_entry(n) for n in ("notes.txt", "other_run", "config"))


def test_a_folder_that_existed_keeps_what_a_run_logged_or_saved_there(tmp_path):
  """A run that failed after logging a step or saving in a folder that existed (resumed, or
  given as --workdir) removes nothing: its logs and checkpoints are results."""
  for result in ("metrics", "checkpoint"):
    workdir = tmp_path / result
    workdir.mkdir()
    before = workdir_cleanup.Before(str(workdir))
    (workdir / "config.json").write_text("{}")
    if result == "metrics":
      (workdir / "metrics.jsonl").write_text('{"step": 1}\n')
    else:
      os.makedirs(workdir / "checkpoints" / "1")
    assert before.clean_up() is False
    assert sorted(os.listdir(workdir)) == sorted(
        ["config.json", "metrics.jsonl" if result == "metrics" else "checkpoints"])


def test_the_lock_names_only_its_latest_holder(tmp_path):
  """record_holder replaces the line a longer earlier one left, and a second trainer's error
  quotes it."""
  (tmp_path / workdir_lock.FILENAME).write_text("pid 1 on a-host-with-a-very-long-name-indeed, "
                                                "since 1999-01-01 00:00:00\n" * 3)
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.acquire()
  lock.record_holder()
  text = (tmp_path / workdir_lock.FILENAME).read_text()
  assert text.count("\n") == 1 and text.startswith(f"pid {os.getpid()} on "), text
  other = workdir_lock.WorkdirLock(str(tmp_path))
  try:
    other.acquire()
    raise AssertionError("a second lock was granted")
  except ValueError as e:
    assert f"last recorded: pid {os.getpid()} on " in str(e)
  lock.release()
  assert not lock.held


def test_a_lock_not_yet_recorded_says_so_and_a_process_without_it_writes_nothing(tmp_path):
  """Before its holder's run started the error says "not recorded yet"; a process that does
  not hold the lock (processes > 0) records nothing."""
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.record_holder()  # not acquired: a no-op
  assert not (tmp_path / workdir_lock.FILENAME).exists()
  lock.acquire()
  try:
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()
    raise AssertionError("a second lock was granted")
  except ValueError as e:
    assert "in use by another trainer (not recorded yet)" in str(e)
  lock.release()


def test_a_lock_that_cannot_flock_closes_its_descriptor(tmp_path, monkeypatch):
  """A file system without flock raises OSError: it reaches the caller, and the lock file's
  descriptor is closed, not leaked."""
  def no_flock(fd, flags):
    raise OSError(38, "Function not implemented")
  monkeypatch.setattr(workdir_lock.fcntl, "flock", no_flock)
  before = len(os.listdir("/proc/self/fd"))
  with pytest.raises(OSError, match="Function not implemented"):
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  assert len(os.listdir("/proc/self/fd")) == before
