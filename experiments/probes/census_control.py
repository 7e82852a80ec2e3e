r"""The head census's distance control: does a head weigh the subject above other nouns at the
same distance from the verb?

The census's subject_minus_attractor (heads.py) compares the subject with the nearest
attractor, which always sits nearer the verb, so a head that prefers recent words reads
negative there whatever it does with roles. Here nouns are compared at equal distance. A
noun's slot is its place counted back from the verb in nouns (the nearest is slot 1;
agreement_probes builds "the N (prep the N)*", so slots are three words apart). With 1-3
attractors and, in half the items, an inserted noun of the subject's number, the subject sits at
slots 2-5 and the other nouns at slots 1-4. Per layer and head, at the census's query (the verb's
first token, teacher-forced):

  subject_minus_other_same_slot: over the slots both hold (each with at least MIN_NOUNS nouns),
    the mean of [mean weight on the subject at slot s - mean weight on another noun at slot s];
  attractor_minus_same_number_same_slot: the same between attractors and inserted nouns of the
    subject's number (the number, not the role: does a head follow the nouns that disagree?).

What this does not control: the subject is always the sentence's second word, so a head drawn to
the sentence's start (or keyed to that position) also favours it; and at slot s the subject comes
from sentences of exactly s nouns, the other nouns from longer ones with more keys to share the
weight, so a head that ignores roles reads above zero too (uniform attention +0.061 on the
census's items: experiments/records/scripts/census_control_baselines.py). A positive score is
therefore an upper bound on a role, to be read against those baselines.

Intervals: items are the unit. The bootstrap resamples items, each with all its nouns, and the
interval given for a model's strongest head is the percentile interval of the maximum over all
heads, taken again in every resample (a maximum runs high, so it does not say where zero is). Over seeds: each seed's strongest
head, and the scores' mean ± sd with their t 95% interval.

  python -m experiments.probes.census_control --lm_workdir runs/probes/lm

Each model's result is cached in its run's probes_eval.json (its checkpoint is loaded only to
compute it); the tables go to census_control.md and census_control.json in --out (default:
--lm_workdir).
"""

import glob
import json
import os

import numpy as np
from absl import flags

from experiments import records
from experiments.probes import heads
from experiments.probes.stats import mean_sd
from launch.sweep_dir import atomic_write
from transformer import cli
from transformer.model import models

FLAGS = flags.FLAGS
flags.DEFINE_string("lm_workdir", None, "Directory whose runs/<scheme>/seed<k> hold the language "
                    "models: a probes --workdir's lm/, or the extrapolation --workdir")
flags.DEFINE_string("schemes", "", "Schemes to read, comma-separated (default: every one there)")
flags.DEFINE_string("seeds", "", "Seeds to read, comma-separated (default: every one there)")
flags.DEFINE_integer("items", 200, "Agreement items per attractor count 1, 2, 3 (the census's "
                     "experiment.census_items)")
flags.DEFINE_integer("item_seed", 0, "Seed of the items (the probes' experiment.seed)")
flags.DEFINE_integer("resamples", 1000, "Bootstrap resamples of the items")
flags.DEFINE_string("out", None, "Directory for census_control.md/.json (default: --lm_workdir)")

MEASURES = {"subject_minus_other_same_slot": (("head",), ("attractor", "same_number")),
            "attractor_minus_same_number_same_slot": (("attractor",), ("same_number",))}
MIN_NOUNS = 20  # a slot enters a measure only where both sides have this many nouns
VERSION = 3  # bumped when the measure changes, so older cached entries are not reused


def noun_weights(rows) -> dict:
  """Every noun of every verb row (heads.verb_rows; None rows are counted as skipped): its
  item's index, its slot, its role and the query's weight on it [layers, N], as arrays; and
  per item the weight on the sentence's first word ("The", before the subject) and on BOS, and
  the census's unmatched measure: the subject's weight minus the nearest attractor's."""
  item, slot, role, weight, n, skipped = [], [], [], [], 0, 0
  first_word, bos, unmatched = [], [], []
  for row in rows:
    if row is None:
      skipped += 1
      continue
    first_word.append(row.mass(0))
    bos.append(row.weights[:, :, row.verb_first, 0])
    nearest = [word for word, r, _ in row.roles if r == "attractor"][-1]
    unmatched.append(row.mass(row.roles[0][0]) - row.mass(nearest))
    for j, (word, r, _) in enumerate(row.roles):
      item.append(n)
      slot.append(len(row.roles) - j)
      role.append(r)
      weight.append(row.mass(word))
    n += 1
  if not n:
    raise ValueError("no agreement item fits the model (all longer than its max_len)")
  return {"item": np.array(item), "slot": np.array(slot), "role": np.array(role),
          "weight": np.stack(weight), "items": n, "skipped_too_long": skipped,
          "first_word": np.stack(first_word), "bos": np.stack(bos),
          "subject_minus_nearest_attractor": np.stack(unmatched)}


def _cells(nouns) -> dict:
  """{measure: [(slot, mask of the first side's nouns, mask of the second's)]} over the slots
  where both sides have at least MIN_NOUNS nouns."""
  out = {}
  for name, sides in MEASURES.items():
    cells = []
    for s in sorted(set(nouns["slot"].tolist())):
      masks = [(nouns["slot"] == s) & np.isin(nouns["role"], roles) for roles in sides]
      if min(m.sum() for m in masks) >= MIN_NOUNS:
        cells.append((s, *masks))
    if not cells:
      skipped, n = nouns["skipped_too_long"], nouns["items"]
      why = (f"{skipped} of the {skipped + n} items are longer than the model's max_len and "
             f"were left out, so a model of a longer max_len (or more --items)" if skipped
             else "more --items")
      raise ValueError(f"{name}: no slot holds {MIN_NOUNS} nouns of both sides in the {n} "
                       f"items read; {why} may fill one")
    out[name] = cells
  return out


def contrasts(nouns, cells, per_item=None) -> dict:
  """Each measure [layers, N], with item i counted per_item[i] times (a bootstrap resample;
  default once each). A slot none of whose nouns a resample drew is left out of its mean."""
  count = (np.ones(nouns["items"]) if per_item is None else per_item)[nouns["item"]]
  out = {}
  for name, slots in cells.items():
    diffs = []
    for _, first, second in slots:
      n1, n2 = count[first].sum(), count[second].sum()
      if n1 and n2:
        diffs.append(np.tensordot(count[first], nouns["weight"][first], 1) / n1
                     - np.tensordot(count[second], nouns["weight"][second], 1) / n2)
    out[name] = np.mean(diffs, 0)
  return out


def same_slot(model, params, tokenizer, num_items: int, seed: int, *, max_len=None,
              resamples: int = 1000, batch: int = 32) -> dict:
  """The two measures of one model, per head, with the strongest head's bootstrap interval
  (maximum over heads per resample) and its own; each slot's mean weights for that head."""
  nouns = noun_weights(heads.verb_rows(model, params, tokenizer, num_items, seed,
                                       max_len=max_len, batch=batch))
  cells = _cells(nouns)
  point = contrasts(nouns, cells)
  rng = np.random.default_rng(0)
  n = nouns["items"]
  boot = {name: [] for name in point}
  for _ in range(resamples):
    per_item = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
    for name, v in contrasts(nouns, cells, per_item).items():
      boot[name].append(v)
  out = {"items": n, "skipped_too_long": nouns["skipped_too_long"], "resamples": resamples}
  for name, scores in point.items():
    b = np.stack(boot[name])  # [resamples, layers, N]
    li, h = np.unravel_index(np.argmax(scores), scores.shape)
    sides = MEASURES[name]
    out[name] = {
        "scores": scores.round(4).tolist(),
        "strongest": {"layer": int(li), "head": int(h), "score": float(scores[li, h]),
                      "max_over_heads_95": np.percentile(b.max((1, 2)), [2.5, 97.5]).tolist(),
                      "this_head_95": np.percentile(b[:, li, h], [2.5, 97.5]).tolist(),
                      # A head drawn to the sentence's start would weigh these as well.
                      "first_word": float(nouns["first_word"][:, li, h].mean()),
                      "bos": float(nouns["bos"][:, li, h].mean()),
                      # The census's subject_minus_attractor of this head: at unequal distance.
                      "unmatched": float(
                          nouns["subject_minus_nearest_attractor"][:, li, h].mean())},
        # This head's mean weight on each side's nouns, and their counts, slot by slot.
        "by_slot": {str(s): {"+".join(roles): [float(nouns["weight"][m][:, li, h].mean()),
                                               int(m.sum())]
                             for roles, m in zip(sides, (first, second))}
                    for s, first, second in cells[name]}}
  return out


def _ints(text: str) -> list[int] | None:
  return [int(x) for x in text.split(",") if x.strip()] or None


def model_results(lm_workdir: str, schemes, seeds, settings: dict) -> dict:
  """{scheme: {seed: same_slot result}} for every run directory there, from each run's cache
  or its checkpoint. A run with neither (records only) is a one-line error naming it."""
  found = {}
  for path in sorted(glob.glob(os.path.join(lm_workdir, "runs", "*", "seed*"))):
    scheme, seed = path.split(os.sep)[-2], path.split(os.sep)[-1][len("seed"):]
    if (not seed.isdigit() or (schemes and scheme not in schemes)
        or (seeds and int(seed) not in seeds)
        or not os.path.exists(os.path.join(path, "summary.json"))):
      continue
    found.setdefault(scheme, {})[int(seed)] = path
  if not found:
    raise ValueError(f"no finished run under {lm_workdir}/runs/<scheme>/seed<k> "
                     f"(schemes {schemes or 'any'}, seeds {seeds or 'any'}): give the "
                     f"directory that holds the language models' runs/")
  out = {}
  for scheme, by_seed in found.items():
    for seed, path in sorted(by_seed.items()):
      with open(os.path.join(path, "summary.json")) as f:
        summary = json.load(f)
      key = {"probe": "census_same_slot", "settings": settings, "version": VERSION,
             "run": records.run_key(summary), "step": summary.get("step")}

      def compute(path=path):
        _, model_config, params, tokenizer = records.load(path)
        print(f"== {path}", flush=True)
        return same_slot(models.make_model(model_config), params, tokenizer,
                         settings["items"], settings["item_seed"],
                         max_len=model_config.max_len, resamples=settings["resamples"])
      out.setdefault(scheme, {})[seed] = records.cached(path, key, compute)
  return out


def table(results: dict) -> list[str]:
  """Per scheme and measure: each seed's strongest head (layer.head score [interval of the
  maximum over heads]) and the scores' mean ± sd over seeds with their t 95% interval."""
  lines = ["| scheme | measure | per seed: strongest head, score [bootstrap 95% of the maximum "
           "over heads] | over seeds: mean ± sd [t 95%] |", "| --- | --- | --- | --- |"]
  for scheme, by_seed in results.items():
    for name in MEASURES:
      cells, scores = [], []
      for seed, r in sorted(by_seed.items(), key=lambda kv: int(kv[0])):
        s = r[name]["strongest"]
        lo, hi = s["max_over_heads_95"]
        cells.append(f"{seed}: {s['layer']}.{s['head']} {s['score']:+.3f} "
                     f"[{lo:+.3f}, {hi:+.3f}]")
        scores.append(s["score"])
      spread = mean_sd(scores)
      over = (f"{spread['mean']:+.3f} ± {spread['sd']:.3f} [{spread['t95'][0]:+.3f}, "
              f"{spread['t95'][1]:+.3f}]" if spread["t95"] else f"{spread['mean']:+.3f} (one seed)")
      lines.append(f"| {scheme} | {name} | {'; '.join(cells)} | {over} |")
  return lines


def main(argv) -> None:
  del argv
  if not os.path.isdir(FLAGS.lm_workdir):
    raise ValueError(f"--lm_workdir={FLAGS.lm_workdir!r} is not a directory: give the one whose "
                     f"runs/<scheme>/seed<k> hold the language models")
  if FLAGS.items < 1 or FLAGS.resamples < 1:
    raise ValueError("--items and --resamples must be at least 1")
  settings = {"items": FLAGS.items, "item_seed": FLAGS.item_seed, "resamples": FLAGS.resamples,
              "min_nouns": MIN_NOUNS}
  schemes = [s for s in FLAGS.schemes.split(",") if s.strip()]
  results = model_results(FLAGS.lm_workdir, schemes, _ints(FLAGS.seeds), settings)
  out = FLAGS.out or FLAGS.lm_workdir
  os.makedirs(out, exist_ok=True)
  lines = ([f"Census distance control ({__name__}): {FLAGS.items} items per attractor count "
            f"1-3 (seed {FLAGS.item_seed}), {FLAGS.resamples} item resamples; models in "
            f"{FLAGS.lm_workdir}.", ""] + table(results))
  atomic_write(os.path.join(out, "census_control.md"), "\n".join(lines) + "\n")
  atomic_write(os.path.join(out, "census_control.json"),
               json.dumps({"settings": settings, "results": results}, indent=1))
  print("\n".join(lines))


if __name__ == "__main__":
  cli.run(main, required=("lm_workdir",))
