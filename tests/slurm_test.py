"""launch/slurm.py: its count flags are checked before anything is written."""

import os
import subprocess
import sys

import pytest

from launch import slurm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = [dict(name="r", command=["python", "-m", "transformer.train"])]


@pytest.mark.parametrize("flag, value, want", [
    ("gpus_per_node", -1, "--gpus_per_node must be >= 0 (0: no --gpus-per-node line), got -1"),
    ("cpus_per_task", -2, "--cpus_per_task must be >= 0 (0: SLURM's default), got -2"),
    ("max_parallel", -1, "--max_parallel must be >= 0 (0: no limit), got -1"),
    ("nodes", 0, "--nodes must be at least 1, got 0")])
def test_negative_counts_are_refused(flag, value, want):
  with pytest.raises(ValueError, match=f"^{want.replace('(', '.').replace(')', '.')}$"):
    slurm.array_script(RUNS, "/w", **{flag: value})


def test_zero_counts_leave_slurms_defaults():
  text = slurm.array_script(RUNS, "/w", gpus_per_node=0, cpus_per_task=0, max_parallel=0)
  assert "#SBATCH --array=0-0\n" in text and "gpus-per-node" not in text
  assert "cpus-per-task" not in text


@pytest.mark.slow
def test_the_command_refuses_a_negative_count_in_one_line_writing_nothing(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "launch.slurm", "--config", "configs/lm.py:size=xs",
       "--workdir", str(tmp_path / "w"), "--sweep=opt.lr=1e-3,3e-3", "--gpus_per_node=-1"],
      capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1] == (
      "error: --gpus_per_node must be >= 0 (0: no --gpus-per-node line), got -1")
  assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_dry_run_prints_the_script_and_writes_nothing(tmp_path):
  """The README's line names a cluster's path (/shared/scaling): --dry_run shows the script
  without creating it."""
  workdir = tmp_path / "shared" / "w"
  proc = subprocess.run(
      [sys.executable, "-m", "launch.slurm", "--config", "configs/lm.py:size=xs",
       "--workdir", str(workdir), "--sweep=opt.lr=1e-3,3e-3", "--dry_run"],
      capture_output=True, text=True, cwd=ROOT, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.startswith("#!/bin/bash") and "#SBATCH --array=0-1" in proc.stdout
  assert not (tmp_path / "shared").exists()
