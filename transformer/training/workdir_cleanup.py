"""What a failed run leaves behind: nothing it created, nothing that existed before removed.

A run that fails (or is interrupted) before it logged a step or saved a checkpoint removes the
workdir if it made it, and the parent folders it made for it; what it wrote by then
(config.json, empty logs, the lock) says nothing. In a folder that existed it removes only the
entries it added (not the .lock: removing a lock file races with its next taker). Either way
it removes only what a run writes (`is_run_entry`): a file or run folder that another process
put there meanwhile (a launcher making runs/<run> in a --workdir given as runs) stays, and so
does a workdir it made that holds one.
"""

import os
import re
import shutil

# What a run writes at the top of its workdir (run_log.py, checkpoint.py, profiling.py,
# wandb_log.py, loop.prepare_workdir): a failed first run removes these names only.
RUN_ENTRIES = ("config.json", "metrics.jsonl", "summary.json", "tensorboard", "checkpoints",
               "tokenizer", "profile", "wandb", "wandb_run_id")


def is_run_entry(name: str) -> bool:
  return (name.removesuffix(".tmp") in RUN_ENTRIES
          or re.fullmatch(r"config\.\d+\.json|\.write_test\.\d+", name) is not None)


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  elif os.path.lexists(path):
    os.remove(path)


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
    for name in set(os.listdir(self.workdir)) - self.entries:
      if is_run_entry(name):
        _remove(os.path.join(self.workdir, name))
    return False


def holds_results(workdir: str) -> bool:
  """A logged step, a checkpoint, or a damaged checkpoint set aside (the user's to judge)."""
  metrics = os.path.join(workdir, "metrics.jsonl")
  folders = [os.path.join(workdir, name) for name in ("checkpoints", "checkpoints_damaged")]
  return ((os.path.exists(metrics) and os.path.getsize(metrics) > 0) or
          any(os.path.isdir(f) and any(os.scandir(f)) for f in folders))


def remove_if_empty_handed(made: list[str]) -> bool:
  """Remove the workdir `made[0]` unless it holds results: what a run wrote there, then the
  folder once empty, then each parent in `made[1:]` as long as it is empty (another process
  may have put something in either since). True if the workdir is gone."""
  if not made or holds_results(made[0]):
    return False
  if os.path.isdir(made[0]):
    for name in os.listdir(made[0]):
      if is_run_entry(name) or name == ".lock":
        _remove(os.path.join(made[0], name))
  remove_empty(made)
  return not os.path.exists(made[0])


def remove_empty(folders: list[str]) -> None:
  """Remove each folder, deepest first, as long as it is empty (missing_folders' order)."""
  for folder in folders:
    try:
      os.rmdir(folder)
    except OSError:
      break
