"""`--config.train.profile_steps=START:END`: a `jax.profiler` trace of steps START..END-1
(END excluded, as in a Python slice) in `<workdir>/profile`.

jax writes `profile/plugins/profile/<time>/<host>.xplane.pb` (TensorBoard's Profile tab:
`tensorboard --logdir <workdir>`, with the tensorboard-plugin-profile package) and
`perfetto_trace.json.gz` beside it (open it in the Perfetto UI). Each step is a
`StepTraceAnnotation("train", step_num=step)`, which both viewers show as steps.
"""

import contextlib
import os

import jax


def parse_steps(value: str, total_steps: int) -> tuple[int, int] | None:
  """(START, END) of a train.profile_steps value, None when it is "" (no profile)."""
  if not value:
    return None
  start, sep, end = value.partition(":")
  try:
    start, end = int(start), int(end)
  except ValueError:
    start = end = None
  if not sep or start is None:
    raise ValueError(f"train.profile_steps={value!r}: use START:END, two step numbers "
                     f"(END excluded), e.g. 10:15")
  if not 1 <= start < end:
    raise ValueError(f"train.profile_steps={value!r}: need 1 <= START < END (END is "
                     f"excluded), e.g. {max(start, 1)}:{max(start, 1) + 5}")
  if end > total_steps + 1:
    raise ValueError(f"train.profile_steps={value!r} runs past train.steps={total_steps}; "
                     f"use an END of at most {total_steps + 1}")
  return start, end


class StepProfiler:
  """Calls the train step, tracing the steps of `steps` (parse_steps' pair, or None)."""

  def __init__(self, steps: tuple[int, int] | None, workdir: str, info=print,
               pause=contextlib.nullcontext):
    """`pause`: a context for the profiler's own work (starting, writing the trace), so the
    loop's step times leave it out (Stopwatch.paused)."""
    self.steps = steps
    self._pause = pause
    self.logdir = os.path.join(workdir, "profile")
    self._info = info
    self._tracing = False
    self._first = None

  def __call__(self, step: int, train_step, *args):
    if self.steps is None or not self.steps[0] <= step < self.steps[1]:
      return train_step(*args)
    if not self._tracing:  # START, or the first step of a session resumed inside the range
      with self._pause():
        jax.profiler.start_trace(self.logdir, create_perfetto_trace=True)
      self._tracing, self._first = True, step
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      out = train_step(*args)
    if step == self.steps[1] - 1:
      jax.block_until_ready(out)  # the trace holds the last step's device work too
      with self._pause():
        self.close()
      self._info(f"profiled steps {self._first}..{step} into {self.logdir}")
    return out

  def close(self) -> None:
    """Ends a trace still running (a run stopped inside the range)."""
    if self._tracing:
      self._tracing = False
      jax.profiler.stop_trace()
