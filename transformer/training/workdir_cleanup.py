"""What a failed run leaves behind: nothing it created, nothing that existed before removed.

A run that fails (or is interrupted) before it logged a step or saved a checkpoint removes the
workdir if it made it, and the parent folders it made for it; what it wrote by then
(config.json, empty logs, the lock) says nothing. A workdir that existed is left as it was.
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


def holds_results(workdir: str) -> bool:
  metrics = os.path.join(workdir, "metrics.jsonl")
  checkpoints = os.path.join(workdir, "checkpoints")
  return ((os.path.exists(metrics) and os.path.getsize(metrics) > 0) or
          (os.path.isdir(checkpoints) and any(os.scandir(checkpoints))))


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
