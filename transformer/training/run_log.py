"""What a run leaves for people and scripts: config.json, metrics.jsonl, TensorBoard events
(tensorboardX), optionally a W&B run (log.wandb_project), a console progress line, and
summary.json at the end.

Only process 0 writes; the others get a RunLog whose methods do nothing, so the training loop
never branches on the process index.

On a terminal the progress is a live tqdm bar (eval results stay as lines above it); when
stdout is a file or pipe (SLURM logs, `| tee`), one plain line per log step and no control
characters.
"""

import contextlib
import json
import math
import os
import sys
import time
import types

import jax
import numpy as np
import tqdm

from transformer import schema
from transformer.training import metrics_file, tensorboard_events, wandb_log
from transformer.training.tensorboard_events import EventWriter


def _jsonable(value):
  if isinstance(value, (np.generic, np.ndarray)) or hasattr(value, "dtype"):
    value = np.asarray(value).item()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/Inf; a string keeps the line parseable
  return value


def _duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _si(x: float) -> str:
  for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.1f}{unit}"
  return f"{x:.0f}"


def _columns(stream) -> int:
  try:
    return os.get_terminal_size(stream.fileno()).columns
  except (AttributeError, OSError, ValueError):
    return 0


def check_fresh_start(workdir: str) -> None:
  """Refuse to start a run at step 0 in a workdir whose summary.json says a run finished
  there: with no checkpoint to resume or report from (deleted to save space, set aside as
  damaged, or a workdir restored from records), starting over would replace that run's
  metrics, TensorBoard events and summary with another's."""
  path = os.path.join(workdir, "summary.json")
  if not os.path.exists(path):
    return
  try:
    with open(path) as f:
      step = json.load(f).get("step", "?")
  except (OSError, ValueError, AttributeError):
    step = "?"
  raise ValueError(f"{workdir} holds a finished run (summary.json, step {step}) but no "
                   f"checkpoint to resume from; training there would start over and replace "
                   f"its logs: use a new --workdir, or move its summary.json, metrics.jsonl "
                   f"and tensorboard/ aside to train it again there")


class RunLog:
  """Per-run log files under `workdir`. `total_steps` sizes the progress bar and the ETA.

  `start_step` is the step the run continues from (the restored checkpoint's, 0 when new):
  history past it, logged by a session that died before saving again, is dropped first, so
  no step appears twice. metrics.jsonl is rewritten atomically up to that step (a torn last
  line goes too, with a warning); TensorBoard event files lose their records past it, and
  the new session's file starts with a SessionLog START at start_step + 1 (which makes
  TensorBoard itself discard any later points it still finds).

  `wandb_project`: also log to that W&B project (wandb_log.py). `stream`: where the progress
  goes (stdout); a live bar when it is a terminal."""

  def __init__(self, workdir: str, total_steps: int, enabled: bool | None = None,
               start_step: int = 0, wandb_project: str = "", stream=None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.workdir = workdir
    self.total_steps = total_steps
    self.start_step = start_step
    self._events = self._jsonl = self._wandb = self._bar = None
    self._stream = stream
    self.notes = []  # what resuming dropped, for the caller to log
    self.earlier_wall_time_s = 0.0
    if self.enabled:
      path = os.path.join(workdir, metrics_file.FILENAME)
      note = metrics_file.cut_back(path, start_step, warn=print)
      if note:
        self.notes.append(note)
      # Rows carry the run's wall time so far, over all its sessions: a resumed run's
      # summary counts the time its earlier sessions spent up to the restored step.
      rows = metrics_file.read(path, warn=None) if os.path.exists(path) else []
      self.earlier_wall_time_s = next(
          (r["wall_time_s"] for r in reversed(rows) if "wall_time_s" in r), 0.0)
      logdir = os.path.join(workdir, "tensorboard")
      earlier = sorted(n for n in (os.listdir(logdir) if os.path.isdir(logdir) else ())
                       if n.startswith("events.out.tfevents."))
      for name in earlier:
        # An earlier end's hparams go without a word: the run goes on and ends again.
        dropped, _ = tensorboard_events.cut_back(os.path.join(logdir, name), start_step)
        if dropped:
          self.notes.append(f"{logdir}/{name}: dropped {dropped} records past step "
                            f"{start_step}")
      self._jsonl = open(path, "a")
      self._events = EventWriter(logdir, restart_step=start_step + 1 if earlier else None)
      if wandb_project:
        self._wandb = wandb_log.WandbWriter(workdir, wandb_project)
      if getattr(self.stream, "isatty", lambda: False)():
        width = len(str(total_steps))
        # A terminal that reports no size (a bare pty) gets a fixed one: tqdm would draw
        # nothing in 0 columns and 0 rows.
        sized = _columns(self.stream) > 0
        self._bar = tqdm.tqdm(
            total=total_steps, initial=start_step, file=self.stream, dynamic_ncols=sized,
            ncols=None if sized else 120, nrows=None if sized else 40, mininterval=0.5,
            # {desc} is shown as given ({postfix} would get a leading ", ").
            bar_format="step {n:>%d}/{total} |{bar}| {desc} [{elapsed}<{remaining}]" % width)

  @property
  def stream(self):
    return self._stream or sys.stdout  # looked up late: tests capture sys.stdout

  def write_config(self, config) -> None:
    """config.json is this invocation's config; a different one there from an earlier
    invocation (a resume with changed settings) is kept as config.1.json, config.2.json..."""
    if not self.enabled:
      return
    path = os.path.join(self.workdir, "config.json")
    text = config.to_json(indent=2, sort_keys=True) + "\n"
    # In TensorBoard's Text tab at the session's first step (a resume's changes show there);
    # past the restored step, so that a later resume from that step cuts it with the rest.
    self._events.text("config", "".join("    " + line for line in text.splitlines(True)),
                      self.start_step + 1)
    if self._wandb:
      self._wandb.config(schema.flatten(config.to_dict()))
    if os.path.exists(path):
      with open(path) as f:
        if f.read() == text:
          return
      n = 1
      while os.path.exists(os.path.join(self.workdir, f"config.{n}.json")):
        n += 1
      os.replace(path, os.path.join(self.workdir, f"config.{n}.json"))
    with open(path, "w") as f:
      f.write(text)

  def info(self, message: str) -> None:
    if self._bar is not None:
      self._bar.write(message, file=self.stream)
    elif self.enabled:
      print(message, file=self.stream, flush=True)

  def metrics(self, step: int, metrics: dict) -> None:
    """One JSON line and one TensorBoard point per key; `step` is the update count."""
    if not self.enabled:
      return
    row = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
    self._jsonl.write(json.dumps(row) + "\n")
    self._jsonl.flush()
    scalars = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
    self._events.scalars(int(step), scalars)
    if self._wandb:
      self._wandb.metrics(int(step), scalars)

  def tick(self, step: int) -> None:
    """Every step: moves the live bar (nothing when stdout is not a terminal)."""
    if self._bar is not None and step > self._bar.n:
      self._bar.update(step - self._bar.n)

  def progress(self, step: int, loss: float, tokens_per_s: float, step_time_s: float,
               eval_loss: float | None = None, eval_bpb: float | None = None) -> None:
    if not self.enabled:
      return
    if self._bar is not None:
      self._bar.set_description_str(
          f"loss {loss:.4f} | {_si(tokens_per_s)} tok/s | {step_time_s * 1e3:.0f} ms/step"
          + ("" if eval_loss is None else f" | eval {eval_loss:.4f}")
          + ("" if eval_bpb is None else f" ({eval_bpb:.3f} bpb)"), refresh=False)
      self.tick(step)
      self._bar.refresh()
      if eval_loss is None:
        return  # evals also leave the full line above the bar
    width = 20
    done = step / max(self.total_steps, 1)
    bar = "#" * int(done * width) + "-" * (width - int(done * width))
    eta = (self.total_steps - step) * step_time_s
    line = (f"step {step:>{len(str(self.total_steps))}}/{self.total_steps} [{bar}] "
            f"loss {loss:.4f} | {_si(tokens_per_s)} tok/s | {step_time_s * 1e3:.0f} ms/step"
            f" | ETA {_duration(eta)}")
    if eval_loss is not None:
      line += f" | eval {eval_loss:.4f}" + ("" if eval_bpb is None else f" ({eval_bpb:.3f} bpb)")
    self.info(line)

  def summary(self, summary: dict) -> None:
    if self.enabled:
      path = os.path.join(self.workdir, "summary.json")
      with open(path + ".tmp", "w") as f:
        json.dump({k: _jsonable(v) for k, v in summary.items()}, f, indent=2, sort_keys=True)
      os.replace(path + ".tmp", path)  # readers (sweep tools) never see half a file
      # TensorBoard's HParams tab: the flat config against the final numbers, per run.
      final = {f"final/{k.removeprefix('final_')}": float(v) for k, v in summary.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
      self._events.hparams(summary.get("config", {}), final, int(summary.get("step", 0)))
      if self._wandb:
        self._wandb.summary({k: _jsonable(v) for k, v in summary.items() if k != "config"})

  def close(self) -> None:
    if self.enabled:
      if self._bar is not None:
        self._bar.close()
      self._jsonl.close()
      self._events.close()
      if self._wandb:
        self._wandb.close()


class Stopwatch:
  """Wall time between log points, excluding pauses the loop declares (eval, saving)."""

  def __init__(self):
    self.start = time.perf_counter()
    self.paused_s = 0.0

  def lap(self) -> float:
    now = time.perf_counter()
    elapsed = now - self.start - self.paused_s
    self.start, self.paused_s = now, 0.0
    return elapsed

  def pause(self, seconds: float) -> None:
    self.paused_s += seconds

  @contextlib.contextmanager
  def paused(self):
    """`with stopwatch.paused() as timer:` leaves the block's time out of the lap;
    `timer.seconds` is how long it took."""
    timer = types.SimpleNamespace(seconds=0.0)
    start = time.perf_counter()
    try:
      yield timer
    finally:
      timer.seconds = time.perf_counter() - start
      self.pause(timer.seconds)
