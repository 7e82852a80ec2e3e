"""Stopping cleanly on SIGTERM/SIGINT (preemption, Ctrl-C): the loop checkpoints at the next
step boundary and exits, and every host of a multi-process job stops at the same step. Before
the loop (start-up, the first compile) and on a second signal, `interruptible()` turns either
signal into `Interrupted`, which the job turns into one line after cleaning up."""

import contextlib
import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM outside the loop's checkpoint-and-stop window. A KeyboardInterrupt, so
  libraries' `except Exception` blocks let it through."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum
    self.name = signal.Signals(signum).name


def _raise(signum, frame):
  del frame
  raise Interrupted(signum)


@contextlib.contextmanager
def interruptible():
  """SIGTERM and SIGINT raise `Interrupted` in the main thread while inside (SIGTERM would
  otherwise kill the process with no chance to clean up, SIGINT raise wherever it lands)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


@contextlib.contextmanager
def ignored():
  """Both signals ignored: a cleanup is not itself interrupted halfway."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


class StopSignal:
  """Turns SIGTERM/SIGINT into a request to checkpoint and exit at the next step boundary.

  A second signal of either kind falls back to the handler before (under `interruptible()`,
  an immediate `Interrupted`)."""

  def __init__(self):
    self.received = None
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    self.received = signal.Signals(signum).name
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def requested(self) -> bool:
    if jax.process_count() == 1:
      return self.received is not None
    # Any host's signal stops every host at the same step, or the save would deadlock.
    flags_ = multihost_utils.process_allgather(np.array(self.received is not None))
    return bool(np.any(flags_))

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      if signal.getsignal(sig) == self._handle:
        signal.signal(sig, handler)
