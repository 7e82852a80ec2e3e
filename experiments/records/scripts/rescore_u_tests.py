"""Redo a published probes result's U-tests with the current experiments/probes/stats.py.

  PYTHONPATH=. python experiments/records/scripts/rescore_u_tests.py RESULTS_DIR

Until 2026-12-07 u_test gave ends minus middle a Wald interval (+- 1.96 SE), which has no width
where both proportions are 0 or 1: a failed model's rows read "+0.000 [+0.000, +0.000]". It now
gives Newcombe's score interval; the U decision (each end above the middle by 2 SE) is the
pre-registered one and did not change. Every retrieval row in RESULTS_DIR/results.json keeps its
items per position, so this recomputes each row's u_test and every scheme's pooled rows from
them, and rewrites results.json and the table lines of results.md that changed. It first renders
the tables from results.json as published and requires each of those lines in results.md as
it is, so that nothing written there by hand is touched.
"""

import json
import os
import sys

from experiments.probes import plots, stats


def render(results, cached):
  """plots.summary's lines; `cached`: each row's u_test as stored, the old way."""
  recomputed = plots.row_u_test
  if cached:
    plots.row_u_test = lambda row: row["u_test"]
  try:
    return plots.summary(results).split("\n")
  finally:
    plots.row_u_test = recomputed


def main(results_dir):
  json_path = os.path.join(results_dir, "results.json")
  md_path = os.path.join(results_dir, "results.md")
  with open(json_path) as f:
    results = json.load(f)
  old = render(results, cached=True)
  for key, _, _ in plots.RETRIEVAL_VARIANTS:
    for by_seed in results.get(key, {}).values():
      for r_seed in by_seed.values():
        for row in r_seed.values():
          if "accuracy_by_position" in row:
            row["u_test"] = stats.row_u_test(row)
    if f"{key}_pooled" in results:
      results[f"{key}_pooled"] = {s: stats.pool_retrieval(r) for s, r in results[key].items()}
  results = json.loads(json.dumps(results))  # the pooled rows' int keys as results.json has them
  new = render(results, cached=False)
  if len(old) != len(new):
    raise SystemExit("the tables changed shape, not only their numbers")
  with open(md_path) as f:
    text = f.read()
  changed = [(a, b) for a, b in zip(old, new) if a != b]
  for a, b in changed:
    if text.count(a + "\n") != 1:
      raise SystemExit(f"{md_path} does not hold this line of the published tables once:\n{a}")
    text = text.replace(a + "\n", b + "\n")
  with open(json_path, "w") as f:
    json.dump(results, f, indent=1)  # as experiments/results.py writes it
  with open(md_path, "w") as f:
    f.write(text)
  print(f"{md_path}: {len(changed)} table lines rescored")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    raise SystemExit(__doc__.split("\n\n")[1])
  main(sys.argv[1])
