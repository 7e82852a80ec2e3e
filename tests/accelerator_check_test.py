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
