"""One trainer per workdir: an exclusive `fcntl.flock` on WORKDIR/.lock for the whole run.

The kernel releases a flock when its process dies (kill -9 included), so a crashed run never
leaves its workdir locked; the file itself stays (removing a lock file races with the next
taker) and holds the latest holder's "pid P on HOST", written once its run has started, for
the error a second launch prints. In a
multi-process job only process 0 locks: the others share its workdir by design.
"""

import fcntl
import os
import socket
import time

FILENAME = ".lock"


class WorkdirLock:
  """`acquire()` takes the lock without writing (a finished run's re-run touches no file);
  `record_holder()` then writes who holds it; `release()` (idempotent) lets go."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, FILENAME)
    self._fd = None

  def acquire(self) -> None:
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      with os.fdopen(fd) as f:
        holder = f.read().strip()
      # The holder writes its line once its run has started (a finished run's re-run writes
      # nothing), so a holder still starting up leaves the previous one's line here.
      holder = f"last recorded: {holder}" if holder else "not recorded yet"
      raise ValueError(f"{os.path.dirname(self.path)} is in use by another trainer ({holder}); "
                       f"wait for it to finish or use another --workdir") from None
    except OSError:  # e.g. a file system without flock: the descriptor is ours to close
      os.close(fd)
      raise
    self._fd = fd

  @property
  def held(self) -> bool:
    return self._fd is not None

  def record_holder(self) -> None:
    if self._fd is None:
      return
    os.ftruncate(self._fd, 0)
    os.pwrite(self._fd, (f"pid {os.getpid()} on {socket.gethostname()}, since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode(), 0)

  def release(self) -> None:
    if self._fd is not None:
      os.close(self._fd)  # closing the last descriptor drops the flock
      self._fd = None
