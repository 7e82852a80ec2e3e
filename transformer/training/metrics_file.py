"""metrics.jsonl, the scripts' source of truth: one JSON object per line, each with a "step".

A kill or a full disk can cut the last line short (no newline, or not valid JSON). Readers
drop such a torn last line with a warning naming the file; a bad line anywhere else is an
error naming the file and the line. The trainer, on resume, rewrites the file (temp file,
fsync, rename) keeping only the rows up to the restored step, so no step appears twice and
nothing is ever appended after a torn line. Standard library only: the launchers and the
scaling fit read it without importing jax.
"""

import json
import os
import sys
from typing import Callable

FILENAME = "metrics.jsonl"


def _warn(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def parse(path: str, warn: Callable[[str], None] | None = _warn) -> tuple[list[dict], bool]:
  """(rows, torn): the file's rows, and whether a torn last line was dropped (`warn` is told
  which file and how many bytes). A missing file has no rows."""
  if not os.path.exists(path):
    return [], False
  with open(path, "rb") as f:
    data = f.read()
  lines = data.split(b"\n")
  complete, tail = lines[:-1], lines[-1]  # tail: what follows the last newline
  rows, torn = [], False
  for number, line in enumerate(complete, 1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except (json.JSONDecodeError, UnicodeDecodeError):
      if number == len(complete) and not tail.strip():
        torn = True  # a newline made it to disk after a cut row: still the last line
        tail = line
        break
      raise ValueError(f"{path}: line {number} is not valid JSON ({line[:60]!r}); only a "
                       f"torn last line is tolerated") from None
  if tail.strip() and not torn:
    torn = True  # no newline: cut, even where it parses (a writer ends every row with one)
  if torn and warn is not None:
    warn(f"warning: {path}: dropped a torn last line ({len(tail)} bytes, "
         f"{tail[:40]!r}...), cut by a kill or a full disk")
  return rows, torn


def read(path: str, warn: Callable[[str], None] | None = _warn) -> list[dict]:
  """The rows of a metrics.jsonl, a torn last line dropped with a warning."""
  return parse(path, warn)[0]


def rewrite(path: str, rows: list[dict]) -> None:
  """Replace the file by `rows` atomically: a reader or a kill sees the old file or the new."""
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
  try:
    os.fsync(directory)
  finally:
    os.close(directory)


def cut_back(path: str, step: int, warn: Callable[[str], None] | None = _warn) -> str | None:
  """Keep the rows of steps <= `step` (the restored checkpoint's; 0 for a fresh start) and no
  torn line; returns what was dropped, for the log, or None if nothing was."""
  if not os.path.exists(path):
    return None
  rows, torn = parse(path, warn)
  kept = [r for r in rows if int(r.get("step", 0)) <= step]
  if not torn and len(kept) == len(rows):
    return None
  rewrite(path, kept)
  dropped = len(rows) - len(kept)
  return (f"{path}: kept the {len(kept)} rows up to step {step}, dropped {dropped} past it"
          + (" and a torn last line" if torn else ""))
