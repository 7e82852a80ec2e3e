"""The probes' statistics: Wilson intervals, the lost-in-the-middle U-test, and pooling a
scheme's seeds (agreement by attractors, retrieval by position)."""

import numpy as np


def wilson(successes: int, n: int, z: float = 1.96) -> list[float]:
  """Wilson score interval of a binomial proportion (95% by default)."""
  if n == 0:
    return [float("nan"), float("nan")]
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  # The interval contains p and lies in [0, 1]; at p = 0 or 1 the two terms cancel only up to
  # rounding, which put the bound a hair past p (a negative error bar that matplotlib refuses).
  return [float(min(max(centre - half, 0.0), p)), float(max(min(centre + half, 1.0), p))]


def newcombe(right_a: int, n_a: int, right_b: int, n_b: int) -> list[float]:
  """95% interval of p_a - p_b for independent binomials: Newcombe's hybrid score interval
  (1998, method 10), from each proportion's Wilson interval. Unlike p_a - p_b +- 1.96 SE it
  keeps a width where a proportion is 0 or 1 (two all-wrong rows: [-0.037, +0.019] at
  n = 200 and 100, not [0, 0]), and it stays in [-1, 1]."""
  p_a, p_b = right_a / n_a, right_b / n_b
  (lo_a, hi_a), (lo_b, hi_b) = wilson(right_a, n_a), wilson(right_b, n_b)
  d = p_a - p_b
  return [float(d - np.hypot(p_a - lo_a, hi_b - p_b)), float(d + np.hypot(hi_a - p_a, p_b - lo_b))]


def u_test(counts: dict) -> dict:
  """The lost-in-the-middle test, fixed before any result: from {position: (right, n)} over
  evenly spaced positions, ends = the first and the last position, middle = the middle third
  of the positions (pooled). The row is U-shaped when EACH end beats the middle by more than
  2 standard errors (binomial, independent samples); pooled ends minus middle is reported
  with its 95% interval, Newcombe's score interval since 2026-12-07 (it was +- 1.96 SE, which
  has no width where both proportions are 0 or 1)."""
  positions = sorted(counts)
  if len(positions) < 3:
    return {"u_shaped": None, "why": "fewer than 3 positions"}
  third = max(1, len(positions) // 3)
  start = (len(positions) - third) // 2
  middle = positions[start:start + third]
  if positions[0] in middle or positions[-1] in middle:
    return {"u_shaped": None, "why": "too few positions for a middle"}

  def items(ps):
    return sum(counts[p][0] for p in ps), sum(counts[p][1] for p in ps)

  def pooled(ps):
    right, n = items(ps)
    return right / n, n

  def diff(a, b):
    (pa, na), (pb, nb) = a, b
    se = np.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb)
    return float(pa - pb), float(se)

  m = pooled(middle)
  first, first_se = diff(pooled([positions[0]]), m)
  last, last_se = diff(pooled([positions[-1]]), m)
  ends, ends_se = diff(pooled([positions[0], positions[-1]]), m)
  return {"middle_positions": middle, "middle": m[0], "first_minus_middle": first,
          "first_se": first_se, "last_minus_middle": last, "last_se": last_se,
          "ends_minus_middle": ends, "ends_se": ends_se,
          "ends_minus_middle_ci95": newcombe(*items([positions[0], positions[-1]]),
                                             *items(middle)),
          # A perfect (or all-wrong) row has SE 0: no difference, not a U.
          "u_shaped": bool(first > 2 * first_se and last > 2 * last_se and first > 0
                           and last > 0)}


def mean_sd(xs) -> dict:
  """{mean, sd, t95} of values over seeds: sd 0.0 and no interval for a single value; t95 is
  the t 95% interval of the mean with the seed as the unit. Every seed scores the same items,
  so this, not a Wilson interval over the pooled items, is the interval over seeds."""
  from scipy import stats  # pylint: disable=g-import-not-at-top  # the experiments extra
  k, mean = len(xs), float(np.mean(xs))
  sd = float(np.std(xs, ddof=1)) if k > 1 else 0.0
  half = float(stats.t.ppf(0.975, k - 1) * sd / np.sqrt(k)) if k > 1 else None
  return {"mean": mean, "sd": sd, "t95": [mean - half, mean + half] if k > 1 else None}


def right_items(cell: dict) -> int:
  """Items right in a position's {accuracy, n}."""
  return round(cell["accuracy"] * cell["n"])


def row_u_test(row: dict) -> dict:
  """u_test of a retrieval row from its items ({position: {accuracy, n}}), so that a row read
  from a cached evaluation gets the current test rather than the one cached with it."""
  return u_test({int(p): (right_items(c), c["n"]) for p, c in row["accuracy_by_position"].items()})


def pool_retrieval(by_seed: dict) -> dict:
  """A scheme's retrieval rows over its seeds, per number of pairs: mean +- sd over seeds of
  the mean accuracy, of each position's accuracy and of the U-test's differences; how many
  seeds' rows are U-shaped; and the U-test on the items of all seeds pooled (its interval is
  over items, the sd over seeds). Rows read from a JSON cache (str keys) and fresh ones (int
  keys) pool alike."""
  pooled = {}
  for n in sorted({int(n) for r in by_seed.values() for n in r}):
    rows = [r.get(n, r.get(str(n))) for r in by_seed.values()]
    rows = [row for row in rows if row and "accuracy_by_position" in row]
    if not rows:
      continue
    counts, accs = {}, {}
    for row in rows:
      for p, c in row["accuracy_by_position"].items():
        right, total = counts.get(int(p), (0, 0))
        counts[int(p)] = (right + right_items(c), total + c["n"])
        accs.setdefault(int(p), []).append(c["accuracy"])
    u_rows = [u for u in map(row_u_test, rows) if u.get("u_shaped") is not None]
    pooled[n] = {
        "seeds": len(rows), "context_tokens": rows[0]["context_tokens"],
        "beyond_training": rows[0].get("beyond_training"),
        "mean_accuracy": mean_sd([row["mean_accuracy"] for row in rows]),
        "accuracy_by_position": {p: {"accuracy": right / total, "n": total,
                                     "wilson95": wilson(right, total),
                                     "over_seeds": mean_sd(accs[p])}
                                 for p, (right, total) in sorted(counts.items())},
        "u_test_pooled": u_test(counts),
        "u_shaped_seeds": sum(bool(u["u_shaped"]) for u in u_rows),
        **{k: mean_sd([u[k] for u in u_rows]) for k in
           ("first_minus_middle", "last_minus_middle", "ends_minus_middle") if u_rows}}
  return pooled


def pool_seeds(by_seed: dict) -> dict:
  """Agreement by attractors over seeds: mean +- sd of the seeds' accuracies with their t
  interval, and the Wilson interval of the pooled items (items x seeds; as every seed scores
  the same items, it speaks for these items and is narrower than an interval over seeds)."""
  out = {}
  for k in range(5):
    # A seed evaluated in this process has int keys; one read from its JSON cache, str keys.
    cells = [r["by_attractors"].get(str(k), r["by_attractors"].get(k)) for r in by_seed.values()]
    cells = [c for c in cells if c]
    if not cells:
      out[str(k)] = None
      continue
    accs = np.array([c["accuracy"] for c in cells])
    right = sum(round(c["accuracy"] * c["n"]) for c in cells)
    n = sum(c["n"] for c in cells)
    out[str(k)] = {**mean_sd(accs), "seeds": len(cells), "n_per_seed": cells[0]["n"],
                   "wilson95_pooled": wilson(right, n)}
  return out
