"""Stopping cleanly on SIGTERM/SIGINT (preemption, Ctrl-C): the loop checkpoints at the next
step boundary and exits, and every host of a multi-process job stops at the same step. Before
the loop (start-up, the first compile) and on a second signal, `interruptible()` turns either
signal into `Interrupted`, which the job turns into one line after cleaning up."""

import _thread
import contextlib
import os
import signal
import sys
import threading
import time

# Light on purpose (jax is imported where used): the train command installs
# `exit_while_starting` before its heavy imports.


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM outside the loop's checkpoint-and-stop window. A KeyboardInterrupt, so
  libraries' `except Exception` blocks let it through."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum
    self.name = signal.Signals(signum).name


def exit_while_starting() -> None:
  """Until `interruptible()` takes over: SIGINT/SIGTERM print one line and exit at once.
  Installed first thing by the train command; nothing is written before then, so nothing is
  left half-done (SIGINT would print a traceback of whatever import it landed in)."""
  def handle(signum, frame):
    del frame
    os.write(2, f"stopped by {signal.Signals(signum).name} while starting; nothing was "
                f"written\n".encode())
    os._exit(128 + signum)
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, handle)


_pending = []  # the signal of an Interrupted that has not reached the job's handler yet


def _raise(signum, frame):
  # An exception raised inside a garbage-collection callback or a __del__ is printed and
  # dropped by Python (a Ctrl-C that lands there would be lost and the run train on), so
  # there it is deferred, and a watchdog re-delivers the signal until one lands.
  if not _pending:
    _pending.append(signum)
    threading.Thread(target=_redeliver, daemon=True).start()
  if frame is not None and frame.f_code.co_name in ("__del__", "_xla_gc_callback"):
    return
  raise Interrupted(signum)


def _redeliver():
  while True:
    time.sleep(1.0)
    if not _pending:
      return
    _thread.interrupt_main(_pending[0])


def handled() -> int | None:
  """The job caught its Interrupted: no more re-delivery. Returns the signal that was pending,
  if one was: an exception other than Interrupted with a signal pending is the signal's too.
  Raised asynchronously, Interrupted can land anywhere, and where it lands code may replace it
  with an error of its own: seen in CI, one raised inside `threading.Condition`'s `with`
  during tfds's dataset construction left its lock's release to fail ("release unlocked lock"),
  which tfds wrapped in a RuntimeError that reached the job instead."""
  signum = _pending[0] if _pending else None
  _pending.clear()
  return signum


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
    _pending.clear()
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def exit_interrupted(e: Interrupted, what: str | None = None) -> None:
  """End the process after an `Interrupted` was cleaned up after: one line on stderr (`what`
  was done, or how to resume), exit status 128 + the signal.

  Not SystemExit: the interpreter's exit would join threads the signal left blocked (a data
  prefetcher on its full queue) and hang. The job closed its checkpoints by now, and the
  kernel drops the workdir's flock."""
  print(f"stopped by {e.name}; "
        f"{what or 're-run the same command to resume from the latest checkpoint'}",
        file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(128 + e.signum)


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
  """Turns SIGTERM/SIGINT into a request to checkpoint and exit at a step boundary.

  A second signal of either kind falls back to the handler before (under `interruptible()`,
  an immediate `Interrupted`)."""

  def __init__(self):
    self.received = None
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    # This may be the watchdog's re-delivery of a signal deferred before the loop: it has
    # reached a handler now, and another re-delivery would land in the restored handler as if
    # it were a second signal (an Interrupted in the middle of the stop's checkpoint).
    handled()
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
    import jax  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
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
