"""experiments/benchmarks/generation.py --quick: both tables print, the cached and recomputed
tokens agree, and greedy decoding of the converted GPT-2 gives Hugging Face's tokens."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quick_mode_prints_both_comparisons_and_the_libraries_agree():
  pytest.importorskip("transformers")
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.generation", "--quick", "--threads=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=900,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "recomputed tokens differ" not in out
  assert re.search(r"growth from 8 to 16 new tokens: cache time x[\d.]+ \(~T\^-?[\d.]+\), "
                   r"recompute time", out)
  # | batch | new tokens | ours: s | ours: tokens/s | HF: s | HF: tokens/s | ratio | agree |
  rows = re.findall(r"^\| (\d+) \| (\d+) \| [\d.]+ \| \d+ \| [\d.]+ \| \d+ \| [\d.]+x \| "
                    r"(\d+)/(\d+) \|$", out, re.M)
  assert [(b, t) for b, t, _, _ in rows] == [("1", "8"), ("1", "32"), ("2", "8"), ("2", "32")]
  for b, t, agree, total in rows:
    assert int(total) == int(b) * int(t)
    assert agree == total, f"batch {b}, {t} tokens: only {agree}/{total} agree with HF"
  for b in ("1", "2"):
    assert re.search(rf"batch {b}, 8 -> 32 new tokens: time ~T\^-?[\d.]+ ours, ~T\^-?[\d.]+ HF",
                     out)
