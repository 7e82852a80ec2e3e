"""Plots and the markdown summary of a probes results.json."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import results as experiment_results  # noqa: E402
from experiments.probes.stats import right_items, row_u_test, wilson  # noqa: E402
from launch.sweep_dir import atomic_write  # noqa: E402


def _pooled_by(by_seed: dict, key: str) -> dict:
  """{value: (accuracy, lo, hi)} pooling items over seeds (Wilson over the pooled items)."""
  out = {}
  for r in by_seed.values():
    for x, c in (r.get(key) or {}).items():
      x = str(x)  # int keys from this process, str keys from a JSON cache: one value each
      if c:
        right, n = out.get(x, (0, 0))
        out[x] = (right + round(c["accuracy"] * c["n"]), n + c["n"])
  return {x: (right / n, *wilson(right, n)) for x, (right, n) in out.items() if n}


def agreement(results: dict, path: str) -> str:
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True, layout="constrained")
  for scheme, by_seed in results["agreement"].items():
    for ax, key, fmt in ((axes[0], "by_attractors", "o"), (axes[1], "by_distance", ".")):
      cells = _pooled_by(by_seed, key)
      xs = sorted(cells, key=int)
      ys = np.array([cells[x][0] for x in xs])
      err = np.array([[cells[x][0] - cells[x][1] for x in xs],
                      [cells[x][2] - cells[x][0] for x in xs]])
      ax.errorbar([int(x) for x in xs], ys, yerr=err, marker=fmt, capsize=3, label=scheme)
  axes[0].set_xlabel("attractors between subject and verb")
  axes[0].set_xticks(range(5))
  axes[1].set_xlabel("words between subject and verb")
  axes[0].set_ylabel("accuracy (agreeing verb, as a complete word, more probable)")
  for ax in axes:
    ax.axhline(0.5, color="gray", linestyle=":")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
  axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
  fig.suptitle("Subject-verb agreement with attractors (chance = 0.5; items pooled over "
               "seeds, bars: Wilson 95%)")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


RETRIEVAL_VARIANTS = (("retrieval", "", "-"), ("retrieval_lm_pretrained", " (LM-pretrained)", "--"))


def compared(results: dict, key: str, scheme: str, seeds) -> bool:
  """Whether a scheme's runs under key ("retrieval" or "retrieval_lm_pretrained") are compared:
  run.py's retrieval_compared (every seed met the criterion) where results.json has it, else
  the same rule over the given seeds (results written before that key)."""
  listed = results.get("retrieval_compared", {}).get(key[len("retrieval"):])
  if listed is not None:
    return scheme in listed
  crit = results.get(key.replace("retrieval", "retrieval_criterion"), {})
  return all(crit.get(scheme, {}).get(seed, {}).get("met") for seed in seeds)


def retrieval_series(results: dict):
  """(label, style, met, {n: accuracy_by_position}) per model, in a fixed order, so a model
  keeps its colour in every panel even where another has no row (e.g. learned positions
  beyond their table). A scheme with several seeds is one series: its items pooled over the
  seeds (each position's over_seeds holds the mean and sd of the seeds' accuracies)."""
  out = []
  for key, suffix, style in RETRIEVAL_VARIANTS:
    criterion = results.get(key.replace("retrieval", "retrieval_criterion"), {})
    for scheme, by_seed in results.get(key, {}).items():
      pooled = results.get(f"{key}_pooled", {}).get(scheme)
      if len(by_seed) > 1 and pooled:
        met = compared(results, key, scheme, by_seed)
        label = (f"{scheme}{suffix} ({len(by_seed)} seeds)"
                 + ("" if met else " [training failure]"))
        out.append((label, style, met, {n: r["accuracy_by_position"]
                                        for n, r in pooled.items()}))
        continue
      for seed, r_seed in by_seed.items():
        met = criterion.get(scheme, {}).get(seed, {}).get("met")
        label = (scheme + suffix + (f" s{seed}" if len(by_seed) > 1 else "")
                 + ("" if met else " [training failure]"))
        rows = {n: r["accuracy_by_position"] for n, r in r_seed.items()
                if r.get("accuracy_by_position") is not None}
        out.append((label, style, met, rows))
  return out


def retrieval(results: dict, path: str) -> str:
  series = retrieval_series(results)
  ns = sorted({n for *_, rows in series for n in rows}, key=int)
  fig, axes = plt.subplots(1, max(len(ns), 1), figsize=(4.6 * max(len(ns), 1), 4.2),
                           sharey=True, squeeze=False, layout="constrained")
  handles = {}
  for ax, n in zip(axes[0], ns):
    for i, (label, style, met, rows) in enumerate(series):
      row = rows.get(n)
      if row is None:
        continue
      ps = sorted(row, key=int)
      ys = np.array([row[p]["accuracy"] for p in ps])
      # Wilson's interval from the items, not the cached "wilson95": caches from before its
      # bounds were clamped to the proportion hold bounds a hair past it at 0 and 1, which
      # are negative error bars that matplotlib refuses.
      bounds = np.array([wilson(right_items(row[p]), row[p]["n"]) for p in ps])
      err = np.array([ys - bounds[:, 0], bounds[:, 1] - ys])
      xs = [int(p) + 1 for p in ps]
      handles[label] = ax.errorbar(
          xs, ys, yerr=err, marker="o", capsize=2, color=f"C{i % 10}",
          linestyle=style if met else ":", alpha=1.0 if met else 0.5, label=label)
      if "over_seeds" in row[ps[0]]:  # pooled seeds: the band is +- sd over seeds
        mean = np.array([row[p]["over_seeds"]["mean"] for p in ps])
        sd = np.array([row[p]["over_seeds"]["sd"] for p in ps])
        ax.fill_between(xs, mean - sd, mean + sd, color=f"C{i % 10}", alpha=0.15, linewidth=0)
    trained = int(n) <= results["kv_train_pairs"]
    ax.set_title(f"{n} pairs ({'within' if trained else 'beyond'} training)")
    ax.set_xlabel("position of the queried pair (1 = first)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("exact-match retrieval accuracy")
  if ns:  # every model, also those missing from the last panel
    labels = [label for label, *_ in series if label in handles]
    axes[0][-1].legend([handles[x] for x in labels], labels, loc="center left",
                       bbox_to_anchor=(1.02, 0.5))
  fig.suptitle(f"Lost in the middle: key-value retrieval by queried position (trained on "
               f"{results.get('kv_min_pairs', '?')}-{results['kv_train_pairs']} pairs; dashed: "
               f"LM-pretrained; dotted: below the criterion; bars: Wilson 95% over the items of all "
               f"seeds; band: ± sd over seeds)")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


def _criterion_lines(results: dict) -> list[str]:
  lines = ["", f"Criterion (stated in advance): exact-match accuracy >= "
           f"{results.get('kv_criterion')} on {results.get('kv_check_items')} held-out items "
           f"of {results['kv_train_pairs']} pairs, queried at uniform positions, checked after "
           f"steps {results.get('kv_stages')} (the last is the cap); a run below it at the cap "
           f"is retried with experiment.kv_retry on the first seed, and a setting that met it "
           f"there but not on another seed with the next entry on every seed (an entry's "
           f"kv_max_steps is "
           f"that attempt's own cap, and its kv_warm_pairs=a,b,... its own warm-up runs, one per "
           f"count, each starting from the one before). Schemes that never meet it"
           f" are training failures and are not compared."
           + (f" Every attempt starts from a warm-up of {results['kv_warm_steps']} steps on "
              f"items of {results.get('kv_warm_pairs')} pairs (not counted in the steps)."
              if results.get("kv_warm_steps") else ""), "",
           "| scheme | seed | criterion met | steps to criterion | settings | checks "
           "(step: accuracy) |", "| --- | --- | --- | --- | --- | --- |"]
  for key, suffix, _ in RETRIEVAL_VARIANTS:
    for scheme, by_seed in results.get(key.replace("retrieval", "retrieval_criterion"),
                                       {}).items():
      for seed, rec in by_seed.items():
        checks = "; ".join(
            f"{'retry ' + str(a['retry']) + ' ' if a['retry'] else ''}"
            + ", ".join(f"{c['step']}: {c['accuracy']:.3f}" for c in a["checks"])
            for a in rec.get("attempts", [])) or rec.get("why", "")
        lines.append(f"| {scheme}{suffix} | {seed} | {rec['met']} | "
                     f"{rec.get('steps_to_criterion') or '—'} | {rec.get('settings', '')} | "
                     f"{checks} |")
  return lines


def _pooled_retrieval_lines(results: dict) -> list[str]:
  """The schemes with more than one seed: mean ± sd over seeds, and the U-test on the items
  of all seeds pooled."""
  lines = []
  for key, suffix, _ in RETRIEVAL_VARIANTS:
    for scheme, pooled in results.get(f"{key}_pooled", {}).items():
      seeds = results[key][scheme]
      if len(seeds) < 2:
        continue
      if not lines:
        lines = ["", "Over seeds (schemes with more than one seed): mean ± sd over the seeds; "
                 "the U-test again on the items of all seeds pooled, with its 95% interval over "
                 "items; how many seeds' own rows are U-shaped.", "",
                 "| scheme | seeds | compared | pairs | mean accuracy | first - middle | "
                 "last - middle | ends - middle | pooled ends - middle [95%] | U-shaped seeds |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
      met = compared(results, key, scheme, seeds)
      for n, row in pooled.items():
        sd = lambda k: (f"{row[k]['mean']:+.3f} ± {row[k]['sd']:.3f}" if k in row else "")
        u = row["u_test_pooled"]
        ci = (f"{u['ends_minus_middle']:+.3f} [{u['ends_minus_middle_ci95'][0]:+.3f}, "
              f"{u['ends_minus_middle_ci95'][1]:+.3f}]" if "ends_minus_middle" in u
              else u.get("why", ""))
        lines.append(
            f"| {scheme}{suffix} | {row['seeds']} | {'yes' if met else 'no (training failure)'} "
            f"| {n} | {row['mean_accuracy']['mean']:.3f} ± {row['mean_accuracy']['sd']:.3f} | "
            f"{sd('first_minus_middle')} | {sd('last_minus_middle')} | "
            f"{sd('ends_minus_middle')} | {ci} | {row['u_shaped_seeds']}/{row['seeds']} |")
  return lines


def _interval(bounds) -> str:
  return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else "n/a"


def summary(results: dict) -> str:
  lines = ["# Probes", "", "## Agreement with attractors", "",
           f"Scoring: {results.get('agreement_scoring', '?')}. Cells: mean ± sd over seeds, "
           "t 95% over seeds (3 seeds make it wide; not clipped to [0, 1]); [Wilson 95% over "
           "the items of all seeds, which every seed shares: narrower than an interval over "
           "seeds] (items per seed).", "",
           "| scheme | " + " | ".join(f"{k} attractors" for k in range(5)) + " |",
           "| --- |" + " --- |" * 5]
  for scheme, pooled in results.get("agreement_pooled", {}).items():
    cells = []
    for k in range(5):
      c = pooled.get(str(k))
      # One seed has no spread to show: "± 0.000" would read as a measured sd of zero.
      spread = (f" ± {c['sd']:.3f}, t {_interval(c.get('t95'))};"
                if c and c.get("seeds", 1) > 1 else " (one seed)")
      cells.append("n/a (too long)" if c is None else
                   f"{c['mean']:.3f}{spread} [{c['wilson95_pooled'][0]:.3f}, "
                   f"{c['wilson95_pooled'][1]:.3f}] ({c['n_per_seed']})")
    lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
  control = results.get("agreement_distance_control", {})
  if control:
    lines += ["", "Control: the same distance with and without an attractor (3 words between "
              "subject and verb: one prepositional phrase whose noun has the subject's number, "
              "or the other number), pooled over seeds (accuracy [Wilson 95%] (items); then the "
              "mean ± sd of the seeds' accuracies); the attractor's cost is each seed's "
              "distance-3 accuracy without minus with one (mean ± sd, t 95% over seeds, "
              "seeds where it is positive):", "",
              "| scheme | distance 0, no attractor | distance 3, no attractor | distance 3, "
              "one attractor | attractor's cost |", "| --- | --- | --- | --- | --- |"]
    over = lambda c: (f"; {c['over_seeds']['mean']:.3f} ± {c['over_seeds']['sd']:.3f}"
                      if "over_seeds" in c and c["over_seeds"]["seeds"] > 1 else "")
    fmt = lambda c: (f"{c['accuracy']:.3f} [{c['wilson95'][0]:.3f}, {c['wilson95'][1]:.3f}] "
                     f"({c['n']}){over(c)}" if c else "n/a")
    cost = lambda c: (f"{c['mean']:+.3f} ± {c['sd']:.3f}, t {_interval(c['t95'])}; "
                      f"{c['positive_seeds']}/{c['seeds']}" if c and c["seeds"] > 1 else "n/a")
    for scheme, cells in control.items():
      lines.append(f"| {scheme} | " + " | ".join(fmt(cells.get(k)) for k in
                                                  ("d0_k0", "d3_k0", "d3_k1"))
                   + f" | {cost(cells.get('attractor_cost'))} |")
  lines += ["", "By verb kind and by head number, pooled over attractor counts and seeds (accuracy [Wilson 95%], "
            "items):", "", "| scheme | verb kind or head number | accuracy |", "| --- | --- | --- |"]
  for scheme, by_seed in results["agreement"].items():
    for key in ("by_verb_kind", "by_head_number"):
      for x, (acc, lo, hi) in sorted(_pooled_by(by_seed, key).items()):
        lines.append(f"| {scheme} | {x} | {acc:.3f} [{lo:.3f}, {hi:.3f}] |")
  lines += ["", "## Lost in the middle", "",
            f"Trained on {results.get('kv_min_pairs')}-{results['kv_train_pairs']} pairs. "
            "U-test (fixed in advance): each end minus the middle third > 2 SE. Rows of "
            "schemes below the criterion are training failures, shown but not compared."]
  lines += _criterion_lines(results)
  lines += ["", "| scheme | seed | compared | pairs | tokens | mean accuracy | first - middle "
            "| last - middle | ends - middle [95%] | U-shaped |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for key, suffix, _ in RETRIEVAL_VARIANTS:
    crit = results.get(key.replace("retrieval", "retrieval_criterion"), {})
    for scheme, by_seed in results.get(key, {}).items():
      for seed, r_seed in by_seed.items():
        # A run that met the criterion is compared only if every seed of its scheme did.
        met = crit.get(scheme, {}).get(seed, {}).get("met")
        compared_ = ("no (training failure)" if not met else "yes"
                     if compared(results, key, scheme, [seed])
                     else "no (met on this seed, not on every seed)")
        name = scheme + suffix
        for n, row in r_seed.items():
          head = f"| {name} | {seed} | {compared_} | {n} |"
          if "accuracy_by_position" not in row:
            lines.append(f"{head} {row.get('context_tokens')} | not applicable | | | | |")
            continue
          u = row_u_test(row)  # not the cached row["u_test"]: the current test
          if u.get("u_shaped") is None:
            lines.append(f"{head} {row['context_tokens']} | {row['mean_accuracy']:.3f} | | | | "
                         f"{u.get('why')} |")
            continue
          lo, hi = u["ends_minus_middle_ci95"]
          lines.append(
              f"{head} {row['context_tokens']} | {row['mean_accuracy']:.3f} | "
              f"{u['first_minus_middle']:+.3f} ± {u['first_se']:.3f} | "
              f"{u['last_minus_middle']:+.3f} ± {u['last_se']:.3f} | "
              f"{u['ends_minus_middle']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {u['u_shaped']} |")
  lines += _pooled_retrieval_lines(results)
  lines += ["", f"LM-pretrained rows: {results.get('lm_then_retrieval')}", ""]
  maps = results.get("attention_maps")
  if maps:
    lines += [f"## Attention maps ({maps['scheme']} model, seed {maps.get('seed', 0)})", "",
              f"Sentence: \"{maps['sentence']}\"; PNGs: " + ", ".join(maps["pngs"])
              + f"; largest |row sum - 1|: {maps.get('max_row_sum_error', 0):.1e}", ""]
  lines += _census_lines(results.get("census", {}))
  return "\n".join(lines) + "\n"


def _census_lines(census: dict) -> list[str]:
  """Per scheme and measure, each seed's strongest head and the strongest score's mean ± sd
  over seeds (the head itself may differ by seed); the notable heads of every seed."""
  seeds = sorted({int(k) for by_seed in census.values() for k in by_seed})
  lines = [f"## Head census (seeds {', '.join(map(str, seeds))} of each scheme; query: the "
           f"verb's first token, teacher-forced; weights on the nouns' words)", "",
           "Cells: each seed's strongest head (seed: layer.head score), then the strongest "
           "score's mean ± sd over seeds (for notable heads: how many each seed has).", "",
           "| scheme | measure | per seed | over seeds |", "| --- | --- | --- | --- |"]
  for scheme, by_seed in census.items():
    rows, notable = {}, {}
    for seed, c in sorted(by_seed.items(), key=lambda kv: int(kv[0])):
      if not c["census"]:
        lines.append(f"| {scheme} | seed {seed}: no item fits the model "
                     f"({c['census_items']}) | | |")
      for name, scores in c["census"].items():
        scores = np.asarray(scores, np.float64)
        li, h = np.unravel_index(np.argmax(scores), scores.shape)
        rows.setdefault(name, []).append((seed, li, h, scores[li, h]))
      for n in c["notable_heads"]:
        notable.setdefault(n["kind"], {}).setdefault(seed, []).append(n)
    for name, entries in rows.items():
      values = np.array([v for *_, v in entries])
      spread = (f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if len(values) > 1
                else f"{values[0]:.3f} (one seed)")
      lines.append(f"| {scheme} | {name} (strongest) | "
                   + "; ".join(f"{s}: {li}.{h} {v:.3f}" for s, li, h, v in entries)
                   + f" | {spread} |")
    for kind, by_kind_seed in notable.items():
      lines.append(f"| {scheme} | notable: {kind} | " + "; ".join(
          f"{s}: " + ", ".join(f"{n['layer']}.{n['head']} {n['score']:.3f}" for n in heads)
          for s, heads in by_kind_seed.items()) + " | heads per seed: " + ", ".join(
          str(len(by_kind_seed.get(s, []))) for s in sorted(by_seed, key=int)) + " |")
  return lines


def write_all(results: dict, workdir: str) -> None:
  agreement(results, os.path.join(workdir, "agreement.png"))
  retrieval(results, os.path.join(workdir, "retrieval.png"))
  atomic_write(os.path.join(workdir, "results.md"),
               summary(results) + experiment_results.footer(results))
