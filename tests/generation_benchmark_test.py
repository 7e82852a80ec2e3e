"""experiments/benchmarks/generation.py --quick: both tables print, the cached and recomputed
tokens agree, greedy decoding of the converted GPT-2 gives Hugging Face's tokens, and the rows
split over two devices give the same (the benchmark stops otherwise). cache_dtype.py --quick:
its table and exponents print, with intervals."""

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
      [sys.executable, "-m", "experiments.benchmarks.generation", "--quick", "--threads=1",
       "--cpu_devices=2"],
      cwd=ROOT, capture_output=True, text=True, timeout=900,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "recomputed tokens differ" not in out
  assert re.search(r"growth from 8 to 16 new tokens: cache time x[\d.]+ \(~T\^-?[\d.]+\), "
                   r"recompute time", out)
  # | batch | new tokens | ours: s, tokens/s | split: s, tokens/s (batch > 1; "-" for one row) |
  # HF: s, tokens/s | ours / HF | split / HF | agree |
  assert "split: the rows over 2 XLA:CPU devices" in out  # --cpu_devices 2 below
  rows = re.findall(r"^\| (\d+) \| (\d+) \| [\d.]+ \| \d+ \| (?:[\d.]+ \| \d+|- \| -) \| "
                    r"[\d.]+ \| \d+ \| [\d.]+x \| (?:[\d.]+x|-) \| (\d+)/(\d+) \|$", out, re.M)
  assert [(b, t) for b, t, _, _ in rows] == [("1", "8"), ("1", "32"), ("2", "8"), ("2", "32")]
  for b, t, agree, total in rows:
    assert int(total) == int(b) * int(t)
    assert agree == total, f"batch {b}, {t} tokens: only {agree}/{total} agree with HF"
  assert re.search(r"batch 1, 8 -> 32 new tokens: time ~T\^-?[\d.]+ ours, ~T\^-?[\d.]+ HF", out)
  assert re.search(r"batch 2, 8 -> 32 new tokens: time ~T\^-?[\d.]+ ours, ~T\^-?[\d.]+ split, "
                   r"~T\^-?[\d.]+ HF", out)


@pytest.mark.slow
def test_the_cache_dtype_benchmark_prints_ratios_and_exponents_with_intervals():
  proc = subprocess.run([sys.executable, "-m", "experiments.benchmarks.cache_dtype", "--quick"],
                        cwd=ROOT, capture_output=True, text=True, timeout=900,
                        env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  num, ci = r"-?[\d.]+", r"-?[\d.]+ \[-?[\d.]+, -?[\d.]+\]"
  rows = re.findall(rf"^\| (\d+) \| {num} \| {num} \| {ci} \| (\d+)/(\d+) \|$", proc.stdout,
                    re.M)
  assert [(t, total) for t, _, total in rows] == [("8", "16"), ("16", "32")]
  for dtype in ("float32", "bfloat16"):
    assert re.search(rf"^{dtype}: 8 -> 16 new tokens, time ~T\^k, k = {ci}$", proc.stdout, re.M)
