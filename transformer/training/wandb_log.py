"""An optional Weights & Biases writer (`--config.log.wandb_project=NAME`, the `wandb` extra).

The run id lives in `<workdir>/wandb_run_id`, so a resumed run continues the same W&B run
(`resume="allow"`) instead of starting a new one; a copy of the workdir at another path
gets a new one (run_id). W&B's own files go to `<workdir>/wandb` unless WANDB_DIR says
where; WANDB_MODE=offline keeps everything there (`wandb sync` uploads it later). W&B keeps
the first value it got for a step: unlike metrics.jsonl and the TensorBoard files, the
points a killed session logged past its last checkpoint are not cut back there (the resumed
session's values of those steps are the same on CPU, where resume is bitwise).
"""

import logging
import os
import secrets
import string

ID_FILE = "wandb_run_id"
INSTALL = "pip install -e '.[wandb]'"


def check_config(project: str) -> None:
  """A set log.wandb_project needs the wandb package: say so before any compute."""
  if not project:
    return
  try:
    import wandb  # noqa: F401
  except ImportError:
    raise ValueError(f"log.wandb_project={project!r} needs the wandb package, which is not "
                     f"installed: {INSTALL} (or leave log.wandb_project empty)") from None


def _new_id() -> str:
  # W&B's own ids: 8 characters of [a-z0-9].
  return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _read(path: str) -> tuple[str, str]:
  """(run id, the absolute workdir it was made in, or "" in files from before it was kept)."""
  with open(path) as f:
    lines = f.read().split("\n")
  return lines[0].strip(), (lines[1].strip() if len(lines) > 1 else "")


def _write(path: str, run: str, workdir: str) -> None:
  with open(path + ".tmp", "w") as f:
    f.write(f"{run}\n{workdir}\n")
  os.replace(path + ".tmp", path)


def run_id(workdir: str) -> str:
  """The workdir's W&B run id, made and stored (atomically) on first use, with the absolute
  workdir it belongs to. A workdir copied to another path (`cp -r run1 run2` to branch a
  run) would otherwise log both runs into one W&B run, each overwriting the other's steps:
  when the recorded workdir still exists and holds the same id, this one is a copy and gets
  a new id. A workdir moved (the recorded one is gone, or holds another id) keeps its id."""
  workdir = os.path.abspath(workdir)
  path = os.path.join(workdir, ID_FILE)
  if not os.path.exists(path):
    run = _new_id()
  else:
    run, made_in = _read(path)
    if made_in == workdir:
      return run
    original = os.path.join(made_in, ID_FILE)
    if made_in and os.path.exists(original) and _read(original)[0] == run:
      logging.warning("%s is a copy of %s, whose W&B run is %s: logging to a new W&B run",
                      workdir, made_in, run)
      run = _new_id()
  _write(path, run, workdir)
  return run


class WandbWriter:
  """One W&B run per workdir; `metrics` logs at the run's step (the update count)."""

  def __init__(self, workdir: str, project: str):
    check_config(project)
    import wandb
    workdir = os.path.abspath(workdir)
    self.id = run_id(workdir)
    try:
      self._run = wandb.init(project=project, id=self.id, resume="allow",
                             name=os.path.basename(workdir),
                             dir=os.environ.get("WANDB_DIR") or workdir)
    except wandb.errors.Error as e:  # not logged in, no network, a bad entity: the user's to fix
      raise ValueError(f"log.wandb_project={project!r}: W&B did not start "
                       f"({str(e).strip().splitlines()[0][:160]}); run `wandb login`, set "
                       f"WANDB_API_KEY or WANDB_MODE=offline, or leave log.wandb_project "
                       f"empty") from None

  def config(self, flat: dict) -> None:
    # A resume may change runtime settings (train.steps, ...): W&B keeps the latest.
    self._run.config.update(flat, allow_val_change=True)

  def metrics(self, step: int, values: dict[str, float]) -> None:
    self._run.log(values, step=step)

  def summary(self, values: dict) -> None:
    self._run.summary.update(values)

  def close(self) -> None:
    self._run.finish()
