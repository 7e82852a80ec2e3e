"""experiments/benchmarks/train_command.py: the summary over interleaved rounds."""

import pytest

from experiments.benchmarks import train_command


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
