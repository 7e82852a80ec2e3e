"""transformer/training/preemption.py: how SIGTERM/SIGINT reach the job's handlers."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, timeout=60,
                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert proc.stdout.strip() == "received SIGTERM", proc.stdout
