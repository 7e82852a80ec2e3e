"""Stopping cleanly on SIGTERM/SIGINT (preemption, Ctrl-C): the loop checkpoints at the next
step boundary and exits, and every host of a multi-process job stops at the same step."""

import signal

import jax
import numpy as np
from jax.experimental import multihost_utils


class StopSignal:
  """Turns SIGTERM/SIGINT into a request to checkpoint and exit at a step boundary.

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

  def requested(self, step: int, every: int = 1) -> bool:
    """Whether to stop after `step`. One process: as soon as a signal arrived. Several: only
    at steps that are multiples of `every` (the loop passes train.log_every), when the hosts
    share their flags, so every host stops at the same step, or the save would deadlock.

    The sharing is a device all-gather that waits for every queued step; at a logging step
    the loop fetches the metrics anyway, so it costs no extra wait there, where at every
    step it would keep each host from queueing the next step ahead of the device.
    (JAX's own preemption sync point, multihost_utils.reached_preemption_sync_point, needs
    SIGTERM delivered to its C++ handler, which this Python one replaces, and picks its
    step asynchronously; this keeps one mechanism for both signals, at a known step.)"""
    if jax.process_count() == 1:
      return self.received is not None
    if step % every:
      return False
    flags_ = multihost_utils.process_allgather(np.array(self.received is not None))
    return bool(np.any(flags_))

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      if signal.getsignal(sig) == self._handle:
        signal.signal(sig, handler)
