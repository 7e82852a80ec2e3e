"""An optional Weights & Biases writer (`--config.log.wandb_project=NAME`, the `wandb` extra).

The run id lives in `<workdir>/wandb_run_id`, so a resumed run continues the same W&B run
(`resume="allow"`) instead of starting a new one. W&B's own files go to `<workdir>/wandb`
unless WANDB_DIR says where; WANDB_MODE=offline keeps everything there (`wandb sync` uploads
it later). W&B keeps the first value it got for a step: unlike metrics.jsonl and the
TensorBoard files, the points a killed session logged past its last checkpoint are not cut
back there (the resumed session's values of those steps are the same on CPU, where resume
is bitwise).
"""

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


def run_id(workdir: str) -> str:
  """The workdir's W&B run id, made and stored (atomically) on first use."""
  path = os.path.join(workdir, ID_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return f.read().strip()
  # W&B's own ids: 8 characters of [a-z0-9].
  new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
  with open(path + ".tmp", "w") as f:
    f.write(new + "\n")
  os.replace(path + ".tmp", path)
  return new


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
