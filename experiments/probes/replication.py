"""Does a second set of models reproduce a probes run's agreement numbers?

Compares the agreement-by-attractors cells of two probes results.json files whose language
models were trained with the same config and seeds (for example, the published models and
the head census's retrained ones, whose floating-point sums differ by machine). Per scheme
and attractor count: each side's mean +- sd over seeds; the paired difference (seed k against
seed k: both sides share the seed's initialization and data order, so only the arithmetic's
rounding separates them) with its t 95% interval over seeds; and, as if the two sides were
independent draws, the difference of the means with its Welch 95% interval. The seeds, not
the items, are the unit: a pooled-items interval would ignore the seed-to-seed spread.

An interval that contains 0 shows no difference, not sameness: with 3 seeds it can be 0.4 wide.
So each cell gets a verdict from two tests at 5%: "different" when the paired 95% interval
excludes 0; "equivalent" when the paired 90% interval lies inside +-margin (two one-sided
t tests, TOST: the difference is shown smaller than the margin); else "inconclusive". The
margin (--margin, in accuracy, default 0.05) is the largest difference one would call the same
model; set it before looking at the table.

  python -m experiments.probes.replication \
    --published experiments/probes/results/grammar_corpus/results.json \
    --replica experiments/probes/results/grammar_corpus_census/results.json
"""

import json
import re

import numpy as np
from absl import flags
from scipy import stats

from transformer import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("published", None, "results.json of the probes run to reproduce")
flags.DEFINE_string("replica", None, "results.json of the run on the second set of models")
flags.DEFINE_float("margin", 0.05, "Equivalence margin in accuracy: a cell is 'equivalent' when "
                   "its paired 90% interval lies inside +-margin (TOST at 5%).")


def seed_accuracies(results: dict, scheme: str, attractors: int) -> dict[str, float]:
  """{seed: agreement accuracy} of one cell (keys as JSON writes them)."""
  by_seed = results["agreement"].get(scheme, {})
  return {str(seed): r["by_attractors"][str(attractors)]["accuracy"]
          for seed, r in sorted(by_seed.items()) if str(attractors) in r["by_attractors"]}


def paired(a: list[float], b: list[float]) -> dict:
  """mean(b - a) over pairs with its t 95% and 90% intervals (needs 2+ pairs); all-equal
  differences give zero-width intervals."""
  d = np.asarray(b, float) - np.asarray(a, float)
  mean, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))
  half95, half90 = (float(stats.t.ppf(q, len(d) - 1)) * se for q in (0.975, 0.95))
  return {"diff": mean, "ci95": [mean - half95, mean + half95],
          "ci90": [mean - half90, mean + half90]}


def verdict(p: dict, margin: float) -> str:
  """'different' (95% interval excludes 0), 'equivalent' (90% interval inside +-margin: TOST
  at 5%) or 'inconclusive'. Both can hold only when the margin is below the difference's
  own resolution; 'different' then wins."""
  if not p["ci95"][0] <= 0 <= p["ci95"][1]:
    return "different"
  return "equivalent" if -margin < p["ci90"][0] and p["ci90"][1] < margin else "inconclusive"


def welch(a: list[float], b: list[float]) -> dict:
  """mean(b) - mean(a) with its Welch 95% interval (needs 2+ values a side). Equal, zero-sd
  sides give a zero-width interval at 0."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  diff = float(b.mean() - a.mean())
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  se = float(np.sqrt(va + vb))
  if se == 0:
    return {"diff": diff, "ci95": [diff, diff]}
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  half = float(stats.t.ppf(0.975, df)) * se
  return {"diff": diff, "ci95": [diff - half, diff + half]}


def dataset_of(results: dict) -> str | None:
  """The corpus the probed language models trained on: results["dataset"], or for files
  written before that key, the `dataset=` argument of configs/probes.py in the recorded
  command (grammar_corpus when it gives none, configs/extrapolation.py's default); None when
  the file records neither."""
  if "dataset" in results:
    return results["dataset"]
  match = re.search(r"configs/probes\.py(:\S*)?", results.get("command", ""))
  if not match:
    return None
  named = re.search(r"(?:^|[:,])dataset=([\w-]+)", match.group(1) or "")
  return named.group(1) if named else "grammar_corpus"


def compare(published: dict, replica: dict, margin: float = 0.05) -> list[dict]:
  """One row per scheme (both sides have it) and attractor count 0-4."""
  if not margin > 0:
    raise ValueError(f"--margin={margin}: give the largest accuracy difference to call the "
                     f"same, > 0 (e.g. 0.05)")
  corpora = dataset_of(published), dataset_of(replica)
  if None not in corpora and corpora[0] != corpora[1]:
    raise ValueError(f"the published models trained on {corpora[0]} and the replica's on "
                     f"{corpora[1]}; a replication compares models trained on the same corpus")
  rows = []
  for scheme in published["agreement"]:
    if scheme not in replica["agreement"]:
      continue
    for k in range(5):
      by_a, by_b = seed_accuracies(published, scheme, k), seed_accuracies(replica, scheme, k)
      if sorted(by_a) != sorted(by_b) or len(by_a) < 2:
        raise ValueError(f"{scheme}, {k} attractors: seeds {sorted(by_a)} published and "
                         f"{sorted(by_b)} replica; the paired comparison needs the same seeds, "
                         f"at least 2")
      a, b = [by_a[k_] for k_ in sorted(by_a)], [by_b[k_] for k_ in sorted(by_a)]
      p = paired(a, b)
      rows.append({"scheme": scheme, "attractors": k,
                   "published": [float(np.mean(a)), float(np.std(a, ddof=1))],
                   "replica": [float(np.mean(b)), float(np.std(b, ddof=1))],
                   **p, "welch_ci95": welch(a, b)["ci95"], "margin": margin,
                   "verdict": verdict(p, margin)})
  return rows


def table(rows: list[dict]) -> str:
  margin = rows[0]["margin"] if rows else 0.05
  lines = ["| scheme | attractors | published | replica | replica - published, paired [t 95%] "
           "| paired [t 90%] | unpaired [Welch 95%] | verdict |",
           "| --- | ---: | --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    lines.append(f"| {r['scheme']} | {r['attractors']} | {r['published'][0]:.3f} ± "
                 f"{r['published'][1]:.3f} | {r['replica'][0]:.3f} ± {r['replica'][1]:.3f} | "
                 f"{r['diff']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] | "
                 f"[{r['ci90'][0]:+.3f}, {r['ci90'][1]:+.3f}] | "
                 f"[{r['welch_ci95'][0]:+.3f}, {r['welch_ci95'][1]:+.3f}] | {r['verdict']} |")
  count = lambda v: sum(r["verdict"] == v for r in rows)
  lines.append(f"\nOf {len(rows)} cells: {count('equivalent')} equivalent within ±{margin:g} "
               f"(paired 90% interval inside it: two one-sided t tests at 5%), "
               f"{count('different')} different (paired 95% interval excludes 0; about "
               f"{0.05 * len(rows):.1f} would by chance if none were), "
               f"{count('inconclusive')} inconclusive (neither).")
  return "\n".join(lines)


def read_results(path: str, flag: str) -> dict:
  try:
    with open(path) as f:
      results = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"--{flag}={path}: cannot read it as JSON ({e}); give the results.json a "
                     f"probes run wrote in its workdir") from None
  if "agreement" not in results:
    raise ValueError(f"--{flag}={path} has no 'agreement' results; give a probes results.json")
  return results


def main(argv):
  del argv
  published = read_results(FLAGS.published, "published")
  replica = read_results(FLAGS.replica, "replica")
  print(table(compare(published, replica, FLAGS.margin)))


if __name__ == "__main__":
  cli.run(main, required=("published", "replica"))
