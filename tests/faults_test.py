"""What machines and people do to a run, end to end through the command line (issue 23): a
disk that fills up (a real one: a small tmpfs), Ctrl-C/SIGTERM at moments of the start-up,
and a sweep launcher killed with kill -9."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from bad_input_test import ROOT, _one_error_line, _tiny_flags
from helpers import tiny_run
from transformer.training import checkpoint_integrity

pytestmark = pytest.mark.slow  # subprocesses (conftest.py)


@pytest.fixture(scope="module")
def env(tmp_path_factory, data_dir):
  """The subprocesses' environment, once a first run built the corpus (its progress bars
  would be on stderr) and filled the compilation cache."""
  out = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
  warm = _train(out, tmp_path_factory.mktemp("warm") / "run", data_dir, 1)
  assert warm.returncode == 0, warm.stderr[-3000:]
  return out


def _train(env, workdir, data_dir, steps, *extra):
  return subprocess.run([sys.executable, "-m", "transformer.train", "--workdir", str(workdir),
                         *_tiny_flags(data_dir, steps), *extra],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.fixture
def small_disk(tmp_path):
  """An 8 MiB tmpfs (needs root and a kernel that lets this process mount)."""
  mount = tmp_path / "disk"
  mount.mkdir()
  if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs needs root")
  proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
                        capture_output=True, text=True)
  if proc.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
  try:
    yield mount
  finally:
    subprocess.run(["umount", str(mount)], check=False)


def _fill(disk, leave_bytes):
  free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
  with open(disk / "filler", "ab") as f:
    f.write(b"\0" * max(0, free - leave_bytes))


def test_a_full_disk_stops_the_run_at_the_save_and_the_rerun_resumes(small_disk, env, data_dir):
  run = small_disk / "run"
  flags = ["--config.train.checkpoint_every=2"]
  assert _train(env, run, data_dir, 2, *flags).returncode == 0
  _fill(small_disk, 256 * 1024)  # room for the logs, not for a checkpoint (~1.3 MiB)

  full = _train(env, run, data_dir, 6, *flags)
  line = _one_error_line(full)
  assert re.match(rf"error: no space left on the device of {run}/checkpoints for the step-4 "
                  r"checkpoint \(about .* needed, .* free\); the last complete checkpoint, step "
                  r"2, is intact: free some space and re-run the same command to resume$", line)
  steps = checkpoint_integrity.step_dirs(str(run / "checkpoints"))
  assert sorted(steps) == [2] and checkpoint_integrity.problem(steps[2]) is None
  assert not [n for n in os.listdir(run / "checkpoints") if "tmp" in n]

  _fill(small_disk, 0)  # full at resume: one line too
  line = _one_error_line(_train(env, run, data_dir, 6, *flags))
  assert line.startswith(f"error: no space left on the device of {run}"), line

  os.remove(small_disk / "filler")
  resumed = _train(env, run, data_dir, 6, *flags)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from step 2" in resumed.stdout
  assert sorted(tiny_run.losses(str(run))) == [1, 2, 3, 4, 5, 6]  # none twice, none lost
  assert json.load(open(run / "summary.json"))["step"] == 6


@pytest.mark.parametrize("async_save", [True, False])
def test_a_disk_that_fills_while_orbax_writes_is_one_line_too(small_disk, env, data_dir,
                                                                async_save):
  """The size check passes (the last step's bytes fit) but the write does not (the files'
  blocks and metadata take more): orbax's writers fail mid-save. One stderr line, nothing of
  the partial step left, and no traceback from the writes it abandoned."""
  run = small_disk / "run"
  flags = ["--config.train.checkpoint_every=2", f"--config.train.async_checkpoint={async_save}"]
  assert _train(env, run, data_dir, 2, *flags).returncode == 0
  step_2 = checkpoint_integrity.step_dirs(str(run / "checkpoints"))[2]
  need = sum(os.path.getsize(os.path.join(parent, name))
             for parent, _, names in os.walk(step_2) for name in names)
  _fill(small_disk, need + 16 * 1024)

  full = _train(env, run, data_dir, 6, *flags)
  assert full.returncode != 0 and len(full.stderr.splitlines()) == 1, full.stderr[-3000:]
  assert re.match(rf"error: no space left on the device of {run}/checkpoints saving the step-4 "
                  r"checkpoint \(.* free\); the last complete checkpoint, step 2, is intact",
                  full.stderr)
  assert os.listdir(run / "checkpoints") == ["2"]
  assert checkpoint_integrity.problem(step_2) is None

  os.remove(small_disk / "filler")
  resumed = _train(env, run, data_dir, 6, *flags)
  assert resumed.returncode == 0 and not resumed.stderr, resumed.stderr[-3000:]
  assert sorted(tiny_run.losses(str(run))) == [1, 2, 3, 4, 5, 6]


# A moment of the start-up: a delay after the process started (imports, flags, config), or
# the stdout line after which the signal is sent (after "decoder:": the corpus statistics;
# after "loss floor": the first compile).
MOMENTS = [("SIGINT", 0.5), ("SIGTERM", 1.5), ("SIGINT", "decoder:"),
           ("SIGTERM", "unigram entropy"), ("SIGINT", "loss floor")]


@pytest.mark.parametrize("name,moment", MOMENTS, ids=lambda v: str(v))
def test_a_signal_during_start_up_is_one_line_and_leaves_nothing_half_made(
    tmp_path, env, data_dir, name, moment):
  workdir = tmp_path / "new" / "run"
  command = [sys.executable, "-m", "transformer.train", "--workdir", str(workdir),
             *_tiny_flags(data_dir, 40)]
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, cwd=ROOT)
  seen = []
  if isinstance(moment, float):
    time.sleep(moment)
  else:
    for line in proc.stdout:
      seen.append(line)
      if line.startswith(moment):
        break
  sent = time.time()
  proc.send_signal(getattr(signal, name))
  out, err = proc.communicate(timeout=120)
  assert time.time() - sent < 30, "not prompt"
  assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
  lines = [line for line in err.splitlines() if line.strip()]
  signum = getattr(signal, name)
  if proc.returncode == 0:  # the loop had begun: it saved and stopped (tests/train_test.py)
    assert f"stopped by {name} at step" in "".join(seen) + out
  else:
    assert proc.returncode == 128 + signum, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"stopped by {name}"), err[-3000:]
    assert not (tmp_path / "new").exists()  # nothing half-made, its parent neither
  again = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert sorted(tiny_run.losses(str(workdir))) == list(range(1, 41))


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/status") as f:
      return "\nState:\tZ" not in f.read()  # a zombie has died (no init may reap it here)
  except FileNotFoundError:
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launcher_killed_with_sigkill_takes_its_trainers_with_it(tmp_path, env, data_dir):
  sweep_dir = tmp_path / "sweep"
  command = [sys.executable, "-m", "launch.local", "--workdir", str(sweep_dir),
             "--sweep=train.seed=0", *_tiny_flags(data_dir, 3000)]  # a key the flags do not set
  launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env, cwd=ROOT)
  lock = sweep_dir / "seed=0" / ".lock"
  deadline = time.time() + 300
  while not (lock.exists() and lock.read_text().startswith("pid ")):
    assert launcher.poll() is None and time.time() < deadline, launcher.communicate()[0]
    time.sleep(0.2)
  trainer = int(lock.read_text().split()[1])
  launcher.kill()
  launcher.wait()
  deadline = time.time() + 60
  while _alive(trainer):
    assert time.time() < deadline, "the trainer outlived its launcher"
    time.sleep(0.2)
  log = (sweep_dir / "seed=0" / "train.log").read_text()
  assert re.search(r"stopped by SIGTERM", log), log[-2000:]
  assert not (sweep_dir / "seed=0" / "summary.json").exists()
