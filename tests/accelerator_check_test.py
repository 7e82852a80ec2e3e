"""experiments/benchmarks/accelerator_check.py --smoke: the device check's program runs on CPU
(tiny shapes) and writes its markdown table with every part in it."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_smoke_mode_runs_every_part_and_writes_the_table(tmp_path):
  out = tmp_path / "check.md"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.accelerator_check", "--smoke",
       f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  text = out.read_text()
  for heading in ("## Attention against dense", "## Training step, bf16", "## Decode with"):
    assert heading in text
  assert "**NO**" not in text
  assert "| packed_gqa | splash (interpret) | float32 |" in text
  assert "refused: no sliding window" in text  # pallas_gpu's clear refusal


def test_a_part_that_crashes_is_recorded_and_the_others_still_run(tmp_path):
  out = tmp_path / "check.md"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.accelerator_check", "--smoke",
       "--skip=attention", "--attention=no_such_attention", f"--out={out}"], cwd=ROOT,
      capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert proc.returncode != 0
  assert "error: the check failed in training, decode" in proc.stderr, proc.stderr[-2000:]
  text = out.read_text()  # written although both parts failed
  assert text.count("failed: ") == 2 and "no_such_attention" in text


def test_an_unknown_part_to_skip_is_refused_before_compute():
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.accelerator_check", "--smoke",
       "--skip=trainig"], cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert proc.returncode != 0
  assert "--skip=trainig: valid parts are attention, training, decode" in proc.stderr
  assert "Accelerator check" not in proc.stdout
