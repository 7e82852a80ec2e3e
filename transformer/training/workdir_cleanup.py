"""What a failed run leaves behind: nothing it created, nothing that existed before removed.

A run that fails (or is interrupted) before it logged a step or saved a checkpoint removes the
workdir if it made it, and the parent folders it made for it; what it wrote by then
(config.json, empty logs, the lock) says nothing. In a folder that existed it removes only the
entries it added (not the .lock: removing a lock file races with its next taker).
"""

import os
import shutil


def missing_folders(workdir: str) -> list[str]:
  """The folders a run in `workdir` will create: it and each missing parent, deepest first."""
  missing, path = [], os.path.abspath(workdir)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    missing.append(path)
    path = os.path.dirname(path)
  return missing


class Before:
  """What was there before a run in `workdir` started; `clean_up()` after it failed."""

  def __init__(self, workdir: str):
    if os.path.exists(workdir) and not os.path.isdir(workdir):
      raise ValueError(f"--workdir {workdir} is a file; give a directory (new or a run's)")
    self.workdir = os.path.abspath(workdir)
    self.made = missing_folders(workdir)
    self.entries = None if self.made else set(os.listdir(self.workdir))

  def clean_up(self) -> bool:
    """Remove what the run added, unless it holds results; True if the workdir it made is
    gone (False for a folder that existed)."""
    if self.made:
      return remove_if_empty_handed(self.made)
    if self.entries is None or holds_results(self.workdir):
      return False
    for name in set(os.listdir(self.workdir)) - self.entries - {".lock"}:
      path = os.path.join(self.workdir, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        os.remove(path)
    return False


def holds_results(workdir: str) -> bool:
  """A logged step, a checkpoint, or a damaged checkpoint set aside (the user's to judge)."""
  metrics = os.path.join(workdir, "metrics.jsonl")
  folders = [os.path.join(workdir, name) for name in ("checkpoints", "checkpoints_damaged")]
  return ((os.path.exists(metrics) and os.path.getsize(metrics) > 0) or
          any(os.path.isdir(f) and any(os.scandir(f)) for f in folders))


def remove_if_empty_handed(made: list[str]) -> bool:
  """Remove the workdir `made[0]` unless it holds results, then each parent in `made[1:]` as
  long as it is empty (another process may have put something there since). True if the
  workdir is gone."""
  if not made or holds_results(made[0]):
    return False
  shutil.rmtree(made[0], ignore_errors=True)
  for parent in made[1:]:
    try:
      os.rmdir(parent)
    except OSError:
      break
  return not os.path.exists(made[0])
