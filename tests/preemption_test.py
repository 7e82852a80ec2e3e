"""transformer/training/preemption.py: how SIGTERM/SIGINT reach the job's handlers."""

import os
import signal
import subprocess
import sys
import textwrap

from transformer.training import preemption

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, timeout=120,
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})


def test_a_deferred_signal_reaches_the_loop_once():
  """A signal that lands in a __del__ before the loop is deferred, and a watchdog re-delivers
  it. Once the loop's StopSignal has taken it (a graceful stop), the watchdog must stop: a
  second delivery would land in the handler StopSignal restored and raise Interrupted in the
  middle of the stop's checkpoint (seen in CI as orbax logging a traceback)."""
  script = """
    import signal, time
    from transformer.training import preemption

    class Code:
      co_name = "__del__"

    class Frame:
      f_code = Code()

    with preemption.interruptible():
      preemption._raise(signal.SIGTERM, Frame())  # deferred: re-delivered within a second
      stop = preemption.StopSignal()
      deadline = time.time() + 10
      while stop.received is None and time.time() < deadline:
        time.sleep(0.05)
      time.sleep(2.5)  # the watchdog re-delivers once a second while the signal is pending
      stop.restore()
    print("received", stop.received)
  """
  proc = _run(script)
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert proc.stdout.strip() == "received SIGTERM", proc.stdout


def test_a_signal_that_library_code_turned_into_its_own_error_still_stops_in_one_line(
    tmp_path):
  """Interrupted is raised wherever the signal lands, and code there may replace it with an
  error of its own (in CI: inside a lock's release during tfds's dataset construction, which
  came out as tfds's RuntimeError). With the signal pending, the job still ends as stopped by
  it: one line, exit status 128 + the signal, what the run made removed."""
  script = f"""
    import os, signal
    import ml_collections
    from transformer.training import loop

    def start_up(config, workdir, lock):
      os.makedirs(os.path.join(workdir, "checkpoints"))
      lock.acquire()  # as _open_checkpoints does before anything else
      try:
        os.kill(os.getpid(), signal.SIGTERM)  # raises Interrupted here
      except KeyboardInterrupt as e:
        raise RuntimeError("Failed to construct dataset: release unlocked lock") from e

    loop._train_and_evaluate = start_up
    loop.train_and_evaluate(ml_collections.ConfigDict(), {str(tmp_path / "run")!r})
  """
  proc = _run(script)
  assert proc.returncode == 128 + 15, proc.stderr[-3000:]
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("stopped by SIGTERM; removed"), proc.stderr
  assert not (tmp_path / "run").exists()


def test_restore_gives_back_only_the_handlers_stop_signal_still_holds():
  """StopSignal.restore puts the earlier handlers back where its own is still installed, and
  leaves a handler installed after it alone."""
  def earlier(signum, frame):
    del signum, frame

  def later(signum, frame):
    del signum, frame
  before = {sig: signal.signal(sig, earlier) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    stop = preemption.StopSignal()
    signal.signal(signal.SIGINT, later)  # someone else's, installed since
    stop.restore()
    assert signal.getsignal(signal.SIGTERM) is earlier
    assert signal.getsignal(signal.SIGINT) is later
  finally:
    for sig, handler in before.items():
      signal.signal(sig, handler)
