"""experiments/benchmarks/train_command.py: the summary over interleaved rounds."""

import os

import numpy as np
import pytest

from experiments.benchmarks import train_command, train_throughput


def test_median_row_takes_medians_of_each_figure_and_the_range_of_each_ratio():
  rounds = [dict(workload="W1", bare_ms=b, train_ms=t, bare_rss=900.0, train_rss=r,
                 torch_ms=p, torch_rss=1000.0, phases={"steps": r})
            for b, t, r, p in [(500.0, 510.0, 990.0, 600.0), (600.0, 540.0, 1000.0, 700.0),
                               (550.0, 560.0, 980.0, 650.0)]]
  row = train_command.median_row(rounds)
  assert (row["bare_ms"], row["train_ms"], row["torch_ms"], row["train_rss"]) == (
      550.0, 540.0, 650.0, 990.0)
  lo, hi = row["ranges"]["train/bare"]
  assert lo == pytest.approx(540 / 600) and hi == pytest.approx(510 / 500)
  assert row["ranges"]["torch/train"] == pytest.approx((650 / 560, 700 / 540))
  assert row["label"] == "W1 median of 3" and row["phases"] == {"steps": 980.0}


def test_each_ratio_has_its_mean_over_rounds_with_the_t_interval_scipy_gives():
  stats = pytest.importorskip("scipy.stats")
  train_over_bare = [1.002, 0.911, 1.071, 0.996, 0.990]
  rounds = [dict(workload="W2", bare_ms=1000.0, train_ms=1000.0 * r, bare_rss=1.0, train_rss=1.0,
                 phases={}) for r in train_over_bare]
  mean, lo, hi = train_command.median_row(rounds)["means"]["train/bare"]
  expected = stats.ttest_1samp(train_over_bare, 1.0).confidence_interval(0.95)
  assert mean == pytest.approx(sum(train_over_bare) / 5)
  assert (lo, hi) == pytest.approx((expected.low, expected.high))
  # More rounds of the same spread narrow the interval.
  _, lo10, hi10 = train_command.median_row(rounds * 2)["means"]["train/bare"]
  assert hi10 - lo10 < hi - lo


def test_bare_steps_are_summarized_as_the_train_command_logs_them():
  # A slow step now and then: the median step misses it, each 5-step window's mean does not.
  times = [0.5, 0.5, 0.5, 0.5, 0.6] * 3 + [0.5, 0.5, 0.5]  # the trailing part window is left out
  assert train_throughput.window_median(times, 1) == 0.5
  assert train_throughput.window_median(times, 5) == pytest.approx(0.52)
  rng = np.random.default_rng(0)
  for window in (1, 2, 5):
    times = list(rng.lognormal(size=7 * window + window - 1))
    means = [sum(times[i:i + window]) / window for i in range(0, 7 * window, window)]
    assert train_throughput.window_median(times, window) == pytest.approx(sorted(means)[3])
  with pytest.raises(ValueError, match="--window=6"):
    train_throughput.window_median(times[:5], 6)


def test_the_pytorch_run_does_not_load_jax():
  # Its peak resident memory is compared with the train command's: jax and XLA loaded into it
  # (about 200 MiB) would count a framework it never uses.
  import subprocess
  import sys
  pytest.importorskip("torch")
  code = ("import sys, experiments.benchmarks.train_throughput_torch; "
          "print(sorted(m for m in ('jax', 'jaxlib', 'flax') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert out.stdout.strip() == "[]"


def test_best_of_eager_and_compiled_pytorch_is_taken_round_by_round():
  # Whichever PyTorch path is faster in a round is the peer that round is judged against.
  rounds = [dict(workload="W1", bare_ms=500.0, train_ms=500.0, bare_rss=1.0, train_rss=900.0,
                 torch_ms=p, torch_rss=1000.0, compiled_ms=c, compiled_rss=800.0, phases={})
            for p, c in [(600.0, 550.0), (700.0, 750.0)]]
  row = train_command.median_row(rounds)
  assert row["ranges"]["best/train"] == pytest.approx((550 / 500, 700 / 500))
  assert row["means"]["best/train"][0] == pytest.approx((550 + 700) / 1000)
  assert row["ranges"]["train/compiled MiB"] == pytest.approx((900 / 800, 900 / 800))
  assert "best/train" not in train_command.median_row(
      [{k: v for k, v in r.items() if not k.startswith("compiled")} for r in rounds])["ranges"]
