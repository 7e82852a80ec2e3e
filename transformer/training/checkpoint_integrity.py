"""Which checkpoints are intact: a sha256 of every file of a step, recorded once its save is
complete, checked before a run resumes from it; a damaged step is moved aside, never deleted.

Orbax makes a save atomic (a temporary folder renamed once complete) but cannot vouch for the
files afterwards: a truncating copy, a disk error or a stray `rm` damages a finished step, and
orbax then fails deep in tensorstore (or, for flipped bytes, may load them: a NaN later that
names the damaged step as the last good one). So process 0 writes STEP/sha256sums.json, as
`sha256sum` would, once a step is complete (inside the step folder, so orbax's retention
deletes it with its step), and resuming checks the newest step against it. A step with no
record (saved by an older version, or killed between orbax's rename and the record) is read
back whole before a single-process run resumes from it (a missing or truncated file fails the
read; a NaN or inf in it, as flipped exponent bits give, fails the check), then recorded;
flipped bits that leave finite numbers cannot be told from the saved ones. A multi-process
run checks such a step for its items only. Damaged steps go to WORKDIR/checkpoints_damaged/,
where orbax does not look.
"""

import hashlib
import json
import os

SUMS = "sha256sums.json"
ITEMS = ("params", "train_state", "data", "meta")  # checkpoint.save's items
DAMAGED = "checkpoints_damaged"


def step_dirs(directory: str) -> dict[int, str]:
  """{step: folder} of the folders orbax reads as steps (plain integers)."""
  if not os.path.isdir(directory):
    return {}
  return {int(name): os.path.join(directory, name) for name in os.listdir(directory)
          if name.isdigit() and os.path.isdir(os.path.join(directory, name))}


def _files(step_dir: str) -> list[str]:
  out = []
  for parent, _, names in os.walk(step_dir):
    out += [os.path.relpath(os.path.join(parent, n), step_dir) for n in names]
  return sorted(f for f in out if f != SUMS and not f.startswith(SUMS + "."))


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def record(step_dir: str) -> None:
  """Write STEP/sha256sums.json (atomically: a kill leaves no half record) unless present."""
  path = os.path.join(step_dir, SUMS)
  if os.path.exists(path):
    return
  sums = {f: [os.path.getsize(os.path.join(step_dir, f)), _sha256(os.path.join(step_dir, f))]
          for f in _files(step_dir)}
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    with open(tmp, "w") as f:
      json.dump({"files": sums}, f, indent=0)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def problem(step_dir: str) -> str | None:
  """What is wrong with a step's folder (None if it is intact, as far as can be told)."""
  missing = [item for item in ITEMS if not os.path.isdir(os.path.join(step_dir, item))]
  if missing:
    return (f"no {'/, '.join(missing)}/ in it: an empty or partial step folder"
            if len(missing) < len(ITEMS) else "an empty or stray step folder")
  path = os.path.join(step_dir, SUMS)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      sums = json.load(f)["files"]
    # A record that parses but is not {name: [size, digest]} is damage too, not a crash.
    sums = {name: (int(size), str(digest)) for name, (size, digest) in sums.items()}
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return f"its {SUMS} is unreadable"
  for name, (size, digest) in sums.items():
    full = os.path.join(step_dir, name)
    if not os.path.isfile(full):
      return f"{name} is missing"
    have = os.path.getsize(full)
    if have != size:
      return f"{name} has {have} bytes, {size} when saved"
    if _sha256(full) != digest:
      return f"{name} changed since it was saved (sha256 mismatch)"
  return None


def unreadable(step_dir: str) -> str | None:
  """Read a step with no record back whole, as saved (NumPy, no device); what fails, or None.
  Single-process only: orbax's restore synchronizes the processes that call it."""
  # Deferred: this module's other checks need none of these.
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  from absl import logging as absl_logging
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)  # "Metadata file does not exist" per item
  try:
    for item in ("data", "meta"):
      with open(os.path.join(step_dir, item, "metadata")) as f:
        json.load(f)
    with ocp.PyTreeCheckpointer() as checkpointer:
      for item in ("params", "train_state"):
        path = os.path.join(step_dir, item)
        tree = checkpointer.metadata(path).item_metadata.tree
        as_numpy = ocp.args.PyTreeRestore(restore_args=jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree))
        for leaf in jax.tree.leaves(checkpointer.restore(path, args=as_numpy)):
          leaf = np.asarray(leaf)
          if np.issubdtype(leaf.dtype, np.floating) and not np.isfinite(leaf).all():
            return f"{item}/ holds NaN or inf values"
  except Exception as e:  # pylint: disable=broad-except
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    return f"it does not read back: {first}"
  finally:
    absl_logging.set_verbosity(verbosity)
  return None


def set_aside_damaged(workdir: str, log=print, single_process: bool = True) -> list[int]:
  """Move the damaged steps newer than the newest intact one to WORKDIR/checkpoints_damaged/,
  one line each; returns their steps. Only the newest steps are read: a resume reads no other.
  `single_process`: whether a step with no record may be read back (see `unreadable`)."""
  directory = os.path.join(workdir, "checkpoints")
  steps = step_dirs(directory)
  damaged, intact = [], None
  for step in sorted(steps, reverse=True):
    what = problem(steps[step])
    unrecorded = not os.path.exists(os.path.join(steps[step], SUMS))
    if what is None and unrecorded and single_process:
      what = unreadable(steps[step])
      if what is None:
        record(steps[step])  # from here on, later damage to it is seen
    if what is None:
      intact = step
      break
    damaged.append((step, what))
  for step, what in damaged:
    aside = os.path.join(workdir, DAMAGED, str(step))
    n = 1
    while os.path.exists(aside):
      aside, n = os.path.join(workdir, DAMAGED, f"{step}.{n}"), n + 1
    os.makedirs(os.path.dirname(aside), exist_ok=True)
    os.replace(steps[step], aside)
    then = (f"resuming from step {intact}" if intact is not None else
            "no intact checkpoint is left: training from step 0")
    log(f"checkpoint step {step} in {directory} is damaged ({what}); moved it to {aside}; "
        f"{then}")
  return [step for step, _ in damaged]
