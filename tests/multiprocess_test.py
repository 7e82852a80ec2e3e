"""Two processes on localhost (jax.distributed, CPU collectives over gloo) train one model
together and agree with one process that holds both devices and both data shards, and a
SIGTERM to one of them stops both at the same step."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from helpers import tiny_run

pytestmark = pytest.mark.slow  # subprocesses / end-to-end runs (conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = ["train.steps=3", "train.checkpoint_every=2", "train.data_shards=2"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _cmd(workdir, data_dir, *flags):
  cmd = [sys.executable, os.path.join(HERE, "helpers", "tiny_run.py"), "--workdir", str(workdir),
         "--data_dir", data_dir, *flags]
  for s in SETS:
    cmd += ["--set", s]
  return cmd


def test_two_processes_agree_with_one(tmp_path):
  env = dict(os.environ)
  data_dir = str(tmp_path / "tfds")
  one_env = dict(env, XLA_FLAGS=env.get("XLA_FLAGS", "") +
                 " --xla_force_host_platform_device_count=2")
  single = subprocess.run(_cmd(tmp_path / "one", data_dir), capture_output=True, text=True,
                          env=one_env, timeout=600, cwd=os.path.dirname(HERE))
  assert single.returncode == 0, single.stderr[-3000:]
  reference = json.loads(single.stdout.strip().splitlines()[-1])

  address = f"localhost:{_free_port()}"
  procs = [subprocess.Popen(
      _cmd(tmp_path / "two", data_dir, "--coordinator_address", address,
           "--num_processes", "2", "--process_id", str(i)),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
      cwd=os.path.dirname(HERE)) for i in range(2)]
  outs = _wait_both(procs)
  together = json.loads(outs[0][0].strip().splitlines()[-1])

  steps = sorted(reference["losses"])
  np.testing.assert_allclose([together["losses"][s] for s in steps],
                             [reference["losses"][s] for s in steps], atol=1e-5, rtol=0)
  assert together["summary"]["final_eval_loss"] == pytest.approx(
      reference["summary"]["final_eval_loss"], abs=1e-5)
  # Only process 0 writes the run's logs.
  assert len(os.listdir(tmp_path / "two" / "tensorboard")) == 1
  assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == ["2", "3"]



def test_sigterm_to_one_process_stops_both_at_the_same_logging_step(tmp_path):
  # The hosts share their stop flags only every train.log_every steps: a SIGTERM that process
  # 0 takes while fetching step 3's batch stops both processes after step 4 (not 3), with one
  # checkpoint of step 4 that both wrote their shards of. Only process 0 prints.
  env = dict(os.environ)
  data_dir = str(tmp_path / "tfds")
  sets = ["train.steps=8", "train.log_every=2", "train.checkpoint_every=1000",
          "train.data_shards=2"]
  outs = _two(tmp_path / "run", data_dir, env, sets, first=["--signal_at_step", "3:SIGTERM"])
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert [r["summary"] for r in results] == [{"step": 4, "stopped": True}] * 2
  assert "stopped by SIGTERM at step 4" in "".join(outs[0])
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["4"]
  assert sorted(map(int, results[0]["losses"])) == [2, 4]  # the logged steps


def _two(workdir, data_dir, env, sets, first=()):
  """Run tiny_run.py as two processes of one job (`first`: process 0's extra flags); their
  (stdout, stderr), process 0 first, once both exited 0."""
  address = f"localhost:{_free_port()}"
  procs = []
  for i in range(2):
    cmd = [sys.executable, os.path.join(HERE, "helpers", "tiny_run.py"), "--workdir",
           str(workdir), "--data_dir", data_dir, "--coordinator_address", address,
           "--num_processes", "2", "--process_id", str(i), *(first if i == 0 else ())]
    for s in sets:
      cmd += ["--set", s]
    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env, cwd=os.path.dirname(HERE)))
  return _wait_both(procs)


def _wait_both(procs):
  """Both processes' (stdout, stderr) once both exited 0. A failure shows both processes'
  ends: one's error is often the other's hang (a barrier that timed out names the process
  that never reached it)."""
  outs = [p.communicate(timeout=600) for p in procs]
  report = "\n".join(f"--- process {i} (exit {p.returncode}) stdout:\n{out[-1500:]}\n"
                     f"--- process {i} stderr:\n{err[-2000:]}"
                     for i, (p, (out, err)) in enumerate(zip(procs, outs)))
  assert all(p.returncode == 0 for p in procs), report
  return outs


def test_a_damaged_checkpoint_is_set_aside_once_and_both_processes_resume_before_it(
    tmp_path):
  env = dict(os.environ)
  data_dir, run = str(tmp_path / "tfds"), tmp_path / "run"
  _two(run, data_dir, env, ["train.steps=4", "train.checkpoint_every=2", "train.data_shards=2"])
  params = run / "checkpoints" / "4" / "params"
  files = [os.path.join(p, n) for p, _, names in os.walk(params) for n in names]
  with open(max(files, key=os.path.getsize), "r+b") as f:
    f.truncate(100)

  outs = _two(run, data_dir, env, ["train.steps=6", "train.checkpoint_every=2",
                                   "train.data_shards=2"])
  printed = outs[0][0] + outs[1][0]
  assert printed.count("checkpoint step 4 in") == 1 and "is damaged (params/" in printed
  assert "resumed from step 2" in outs[0][0]
  assert os.listdir(run / "checkpoints_damaged") == ["4"]
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert [r["summary"]["step"] for r in results] == [6, 6]
  assert sorted(tiny_run.losses(str(run))) == [1, 2, 3, 4, 5, 6]  # none twice, none lost
