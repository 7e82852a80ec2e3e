"""Stopping cleanly on SIGTERM/SIGINT (preemption, Ctrl-C): the loop checkpoints at the next
step boundary and exits, and every host of a multi-process job stops at the same step."""

import signal

import jax
import numpy as np
from jax.experimental import multihost_utils


class StopSignal:
  """Turns SIGTERM/SIGINT into a request to checkpoint and exit at the next step boundary.

  A second signal of either kind falls back to the default (immediate) behaviour."""

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
