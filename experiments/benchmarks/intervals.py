"""The benchmarks' interval over rounds. No flags here: a benchmark that imports it does not
take on another benchmark's flags (which absl would then accept and ignore)."""

import statistics

from scipy import stats


def mean_ci95(values: list[float]) -> tuple[float, float, float]:
  """The mean and its t 95% interval (Student, n - 1 degrees of freedom; needs 2+ values)."""
  mean = statistics.fmean(values)
  lo, hi = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
  return mean, float(lo), float(hi)
