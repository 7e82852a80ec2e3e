"""Running out of disk space while a run saves: a check before each save, and the one line
(`DiskFull`: which folder, how much is free, which checkpoint is intact) that any ENOSPC
becomes, synchronous or inside orbax's writer threads, with the failed step's partial folder
removed and the writers' own noise kept off the terminal."""

import errno
import logging
import os
import shutil
import sys
import threading
import time

import jax

from transformer.training import checkpoint_integrity


class DiskFullNoiseFilter(logging.Filter):
  """Orbax's writer threads log each ENOSPC with its traceback; `DiskFull` says it once. Once
  it did, their complaints about the failed step's removed temporary folder go too."""
  abandoned = False  # set when a DiskFull removed a partial step

  def filter(self, record):
    error = record.exc_info[1] if record.exc_info else None
    if DiskFullNoiseFilter.abandoned and ".orbax-checkpoint-tmp" in record.getMessage():
      return False
    return _is_disk_full(record.getMessage()) is None and _is_disk_full(error) is None


class DiskFull(ValueError):
  """A save, or another write of the run, failed for lack of space: one line for the user."""


def _is_disk_full(error):
  """The ENOSPC/EDQUOT OSError anywhere in the chain, or the error with tensorstore's text
  for it; None if there is none."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
      return error
    text = str(error)
    if "No space left on device" in text or "os_error_code='28'" in text:
      return error
    if isinstance(error, str):
      return None
    error = error.__cause__ or error.__context__
  return None


def _free_bytes(path: str) -> int | None:
  while path and not os.path.exists(path):
    path = os.path.dirname(path)
  try:
    return shutil.disk_usage(path or ".").free
  except OSError:
    return None


def _size(n: float) -> str:
  for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
    n /= 1024


def free_space(path: str) -> str:
  """'12.3 MiB free' on the file system that holds `path` (or its nearest existing parent)."""
  free = _free_bytes(path)
  return "free space unknown" if free is None else f"{_size(free)} free"


def check_space(manager, step: int, state: dict) -> None:
  """Refuse a save that cannot fit before writing a byte of it: an ENOSPC inside orbax's
  writer threads stops the run too, but amid their noise. The need is the last step's size on
  disk (orbax compresses), or the state's bytes for a first save."""
  directory = str(manager.directory)
  steps = checkpoint_integrity.step_dirs(directory)
  if steps:
    last = steps[max(steps)]
    need = sum(os.path.getsize(os.path.join(parent, name))
               for parent, _, names in os.walk(last) for name in names)
  else:
    need = sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))
  free = _free_bytes(directory)
  if free is not None and free < need:
    last = (f"the last complete checkpoint, step {max(steps)}, is intact" if steps else
            "no checkpoint was completed yet")
    raise DiskFull(f"no space left on the device of {directory} for the step-{step} "
                   f"checkpoint (about {_size(need)} needed, {_size(free)} free); {last}: free "
                   f"some space and re-run the same command to resume")


def disk_full(error, where: str) -> DiskFull | None:
  """The one-line DiskFull for `error` if it is one (None otherwise); `where`: what was written."""
  found = _is_disk_full(error)
  if found is None:
    return None
  path = getattr(found, "filename", None) or where
  return DiskFull(f"no space left on the device of {path} ({free_space(path)}): free some "
                  f"space and re-run the same command to resume")


def _remove_tree(path: str, quiet_s: float = 0.3, limit_s: float = 10.0) -> None:
  """rmtree until the folder stays gone for `quiet_s`: a failed synchronous save leaves
  tensorstore's other writes of the step running, and they recreate files behind a single
  rmtree (orbax offers no handle to wait for them)."""
  deadline = time.monotonic() + limit_s
  while True:
    shutil.rmtree(path, ignore_errors=True)
    time.sleep(quiet_s)
    if not os.path.exists(path) or time.monotonic() > deadline:
      return


# What orbax's abandoned write coroutines print once a save failed: tensorstore callbacks
# into an event loop that orbax's run_sync already closed (as "unraisable" exceptions), and
# its futures' threads once the interpreter shuts down.
_SHUTDOWN_NOISE = ("Event loop is closed", "cannot schedule new futures after interpreter shutdown")


def _noise(exc) -> bool:
  return isinstance(exc, RuntimeError) and str(exc) in _SHUTDOWN_NOISE


def drop_abandoned_write_noise() -> None:
  """Drop exactly those RuntimeErrors' tracebacks (installed once, with the first manager);
  every other exception still prints. They follow a failed save, which says it in one line,
  and can come before that line: the loop closes before the error reaches `save`."""
  if getattr(sys.unraisablehook, "_drops_write_noise", False):
    return
  previous_unraisable, previous_thread = sys.unraisablehook, threading.excepthook

  def unraisable(info):
    if not _noise(info.exc_value):
      previous_unraisable(info)

  def thread(args):
    if not _noise(args.exc_value):
      previous_thread(args)

  unraisable._drops_write_noise = True
  sys.unraisablehook, threading.excepthook = unraisable, thread


def save_failed(error, manager) -> DiskFull | None:
  """A failed save as DiskFull, its partial temporary folder removed (it only takes space)."""
  if _is_disk_full(error) is None:
    return None
  DiskFullNoiseFilter.abandoned = True  # before the removal below, which its writers see
  # An async save's error surfaces before orbax has waited for its checkpoint-metadata
  # writer, which may still (re)write into the temporary folder: wait for it first, or the
  # folder removed below comes back.
  store = getattr(manager, "_non_blocking_metadata_store", None)
  if store is not None:
    try:
      store.wait_until_finished()
    except Exception:  # pylint: disable=broad-except
      pass  # its own failure is the same full disk
  directory = str(manager.directory)
  partial = [n for n in os.listdir(directory) if ".orbax-checkpoint-tmp" in n] \
      if os.path.isdir(directory) else []
  if jax.process_index() == 0:
    for name in partial:
      _remove_tree(os.path.join(directory, name))
  steps = sorted(checkpoint_integrity.step_dirs(directory))
  failed = ", ".join(sorted({n.split(".")[0] for n in partial})) or "?"
  last = (f"the last complete checkpoint, step {steps[-1]}, is intact" if steps else
          "no checkpoint was completed yet")
  return DiskFull(f"no space left on the device of {directory} saving the step-{failed} "
                  f"checkpoint ({free_space(directory)}); {last}: free some space and re-run "
                  f"the same command to resume")
