"""--config.train.profile_steps=START:END: refused with one line when malformed, and a tiny
run leaves a jax.profiler trace of exactly those steps (END excluded) in <workdir>/profile."""

import glob
import gzip
import json
import os
import subprocess
import sys

import pytest

from helpers import tiny_run
from transformer.training import loop, profiling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_parse_steps():
  assert profiling.parse_steps("", 10) is None
  assert profiling.parse_steps("2:5", 10) == (2, 5)
  assert profiling.parse_steps("10:11", 10) == (10, 11)  # the last step alone


@pytest.mark.parametrize("value,want", [
    ("5:3", "need 1 <= START < END"), ("3:3", "need 1 <= START < END"),
    ("0:2", "need 1 <= START < END"), ("a:b", "use START:END"), ("5", "use START:END"),
    ("2:5:7", "use START:END"), ("2:12", "runs past train.steps=10"),
])
def test_bad_profile_steps_are_refused(value, want):
  with pytest.raises(ValueError) as e:
    profiling.parse_steps(value, 10)
  assert want in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_tiny_run_writes_a_trace_of_the_chosen_steps(tmp_path, data_dir, capsys):
  workdir = str(tmp_path / "run")
  config = tiny_run.tiny_config(data_dir, **{"train.steps": 4, "train.profile_steps": "2:4"})
  loop.train_and_evaluate(config, workdir)
  assert f"profiled steps 2..3 into {workdir}/profile" in capsys.readouterr().out
  (run,) = glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*"))
  assert glob.glob(os.path.join(run, "*.xplane.pb"))  # TensorBoard's Profile tab
  with gzip.open(os.path.join(run, "perfetto_trace.json.gz")) as f:  # the Perfetto UI
    events = json.load(f)["traceEvents"]
  steps = sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train")
  assert steps == [2, 3]
  assert any("fusion" in e.get("name", "") for e in events)  # XLA's kernels of the step


@pytest.mark.slow
@pytest.mark.parametrize("flag,want", [
    ("--config.train.profile_steps=5:3", "error: train.profile_steps='5:3': need 1 <= START"),
    ("--config.log.wandb_project=p", "pip install -e '.[wandb]'"),
])
def test_train_command_refuses_before_compute(tmp_path, flag, want):
  hidden = tmp_path / "no_wandb" / "wandb"  # an environment without wandb
  hidden.mkdir(parents=True)
  (hidden / "__init__.py").write_text("raise ImportError('No module named wandb')\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden.parent), ROOT]))
  proc = subprocess.run([sys.executable, "-m", "transformer.train", "--config",
                         os.path.join(ROOT, "configs", "lm.py") + ":size=xs",
                         "--workdir", str(tmp_path / "w"), flag],
                        capture_output=True, text=True, env=env, timeout=300)
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith("error: ") and want in lines[0], lines
  assert not os.path.exists(tmp_path / "w")
