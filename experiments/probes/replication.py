"""Does a second set of models reproduce a probes run's agreement numbers?

Compares the agreement-by-attractors cells of two probes results.json files whose language
models were trained with the same config and seeds (for example, the published models and
the head census's retrained ones, whose floating-point sums differ by machine). Per scheme
and attractor count: each side's mean +- sd over seeds; the paired difference (seed k against
seed k: both sides share the seed's initialization and data order, so only the arithmetic's
rounding separates them) with its t 95% interval over seeds; and, as if the two sides were
independent draws, the difference of the means with its Welch 95% interval. The seeds, not
the items, are the unit: a pooled-items interval would ignore the seed-to-seed spread. A cell
replicates when the paired interval contains 0.

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


def seed_accuracies(results: dict, scheme: str, attractors: int) -> dict[str, float]:
  """{seed: agreement accuracy} of one cell (keys as JSON writes them)."""
  by_seed = results["agreement"].get(scheme, {})
  return {str(seed): r["by_attractors"][str(attractors)]["accuracy"]
          for seed, r in sorted(by_seed.items()) if str(attractors) in r["by_attractors"]}


def paired(a: list[float], b: list[float]) -> dict:
  """mean(b - a) over pairs with its t 95% interval (needs 2+ pairs); all-equal differences
  give a zero-width interval."""
  d = np.asarray(b, float) - np.asarray(a, float)
  mean, se = float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))
  half = float(stats.t.ppf(0.975, len(d) - 1)) * se
  return {"diff": mean, "ci95": [mean - half, mean + half]}


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


def compare(published: dict, replica: dict) -> list[dict]:
  """One row per scheme (both sides have it) and attractor count 0-4."""
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
                   **p, "welch_ci95": welch(a, b)["ci95"],
                   "replicates": bool(p["ci95"][0] <= 0 <= p["ci95"][1])})
  return rows


def table(rows: list[dict]) -> str:
  lines = ["| scheme | attractors | published | replica | replica - published, paired [t 95%] "
           "| unpaired [Welch 95%] | replicates |", "| --- | ---: | --- | --- | --- | --- | --- |"]
  for r in rows:
    lines.append(f"| {r['scheme']} | {r['attractors']} | {r['published'][0]:.3f} ± "
                 f"{r['published'][1]:.3f} | {r['replica'][0]:.3f} ± {r['replica'][1]:.3f} | "
                 f"{r['diff']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] | "
                 f"[{r['welch_ci95'][0]:+.3f}, {r['welch_ci95'][1]:+.3f}] | "
                 f"{'yes' if r['replicates'] else 'no'} |")
  n = sum(r["replicates"] for r in rows)
  lines.append(f"\n{n} of {len(rows)} cells replicate (the paired interval contains 0); at 95% "
               f"each, about {0.05 * len(rows):.1f} would not by chance.")
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
  print(table(compare(published, replica)))


if __name__ == "__main__":
  cli.run(main, required=("published", "replica"))
