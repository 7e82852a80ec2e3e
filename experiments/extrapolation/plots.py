"""Plots and the markdown table of an extrapolation results.json."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import results as experiment_results  # noqa: E402
from launch.sweep_dir import atomic_write  # noqa: E402


def _series(table: dict, lengths):
  return [table.get(str(n)) for n in lengths]


def loss_vs_length(results: dict, path: str) -> str:
  lengths = results["eval_lengths"]
  L = results["train_length"]
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True, layout="constrained")
  for ax, key, title in [(axes[0], "loss", "non-overlapping windows"),
                         (axes[1], "loss_sliding", "sliding window (stride = length / 2)")]:
    for variant, table in results[key].items():
      cells = [(n, c) for n, c in zip(lengths, _series(table, lengths)) if c is not None]
      if not cells:
        continue
      xs = [n for n, _ in cells]
      ys = np.array([c["mean"] for _, c in cells])
      # Error bars: the larger of the seed sd and the bootstrap half-width over windows.
      err = np.array([max(c["sd"], (c["ci95_windows"][1] - c["ci95_windows"][0]) / 2)
                      for _, c in cells])
      style = "--" if "+" in variant else "-"
      ax.errorbar(xs, ys, yerr=err, fmt=style, marker="o", capsize=3, label=variant)
    ax.axvline(L, color="gray", linestyle=":", label=f"training length {L}")
    if results.get("unigram_entropy"):
      ax.axhline(results["unigram_entropy"], color="black", linestyle="-.", linewidth=0.8,
                 label=f"unigram entropy {results['unigram_entropy']:.2f}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("mean next-token loss (nats/token)")
  axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=9)
  fig.suptitle(f"Length extrapolation on {results.get('dataset', '?')} (trained at {L} tokens;"
               f" mean over {len(results.get('seeds', [0]))} seeds, bars: max(seed sd, "
               f"bootstrap 95% half-width))")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


def per_position(results: dict, path: str, bucket: int = 16) -> str:
  L = results["train_length"]
  fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
  for variant, curve in results["per_position"].items():
    if curve is None:
      continue
    curve = np.asarray(curve)
    n = max(len(curve) // bucket * bucket, bucket)
    b = min(bucket, len(curve))
    smooth = curve[:n // b * b].reshape(-1, b).mean(axis=1)
    xs = np.arange(len(smooth)) * b + b / 2
    ax.plot(xs, smooth, "--" if "+" in variant else "-", label=f"{variant} (to {len(curve)})")
  ax.axvline(L, color="gray", linestyle=":", label=f"training length {L}")
  if results.get("unigram_entropy"):
    ax.axhline(results["unigram_entropy"], color="black", linestyle="-.", linewidth=0.8,
               label="unigram entropy")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("position in the evaluation window (tokens)")
  ax.set_ylabel(f"mean loss (nats/token, {bucket}-token buckets)")
  ax.set_title("Loss by position at the longest applicable evaluation length (seed mean)")
  ax.grid(alpha=0.3)
  ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=9)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


def _cell(c) -> str:
  if c is None:
    return "not applicable"
  lo, hi = c["ci95_windows"]
  return f"{c['mean']:.3f} ± {c['sd']:.3f} [{lo:.3f}, {hi:.3f}]"


def _base(variant: str) -> str:
  return variant.split("+")[0]


def table(results: dict) -> str:
  lengths = results["eval_lengths"]
  L = results["train_length"]
  gap = results.get("gap_at_L", {})
  lines = ["Cells: mean ± sd over seeds (of each seed's mean loss, nats/token) "
           "[bootstrap 95% interval over evaluation windows]. Gap at L: the scheme's loss at "
           "the training length minus the best scheme's there (absolute, relative).", ""]
  for key, title in [("loss", "Non-overlapping windows"),
                     ("loss_sliding", "Sliding window (stride = length / 2)")]:
    lines += [f"### {title}", "",
              "| scheme | gap at L | " + " | ".join(str(n) for n in lengths) + " |",
              "| --- | --- | " + " | ".join("---" for _ in lengths) + " |"]
    for variant, row in results[key].items():
      g = gap.get(variant)
      gcell = f"{g['nats']:+.3f} ({100 * g['relative']:+.1f}%)" if g else "-"
      lines.append(f"| {variant} | {gcell} | "
                   + " | ".join(_cell(c) for c in _series(row, lengths)) + " |")
    lines.append("")
  tpw = results.get("tokens_per_word")
  if tpw:
    lines += [f"### Per word ({tpw:.2f} tokens per word on the evaluated {results.get('eval_tokens')}"
              " tokens): perplexity per word exp(loss x tokens/word), and its ratio to the "
              f"same scheme at L = {L} (Press et al. 2022 report word-level perplexities "
              "on WikiText-103; compare ratios, not absolute values)", "",
              "| scheme | mode | " + " | ".join(str(n) for n in lengths) + " |",
              "| --- | --- | " + " | ".join("---" for _ in lengths) + " |"]
    for key, mode in (("loss", "non-overlapping"), ("loss_sliding", "sliding")):
      for variant, row in results[key].items():
        at_L = row.get(str(L))
        cells = []
        for c in _series(row, lengths):
          if c is None or at_L is None:
            cells.append("n/a")
            continue
          ppl = np.exp(c["mean"] * tpw)
          cells.append(f"{ppl:.2f} (x{ppl / np.exp(at_L['mean'] * tpw):.3f})")
        lines.append(f"| {variant} | {mode} | " + " | ".join(cells) + " |")
    lines.append("")
  tpp = results.get("tokens_per_parameter")
  if tpp:
    summaries = results.get("train_summaries", {})
    lines += ["### Training", "", "| scheme | seeds | params | tokens per parameter |",
              "| --- | --- | --- | --- |"]
    for scheme, ratio in tpp.items():
      runs = summaries.get(scheme, {})
      params = next(iter(runs.values()), {}).get("params_total")
      lines.append(f"| {scheme} | {len(runs)} | {params:,} | {ratio:.2f} |")
    lines.append("")
  if results.get("unigram_entropy"):
    lines += [f"Unigram entropy of the evaluated targets: {results['unigram_entropy']:.3f} "
              "nats/token.", ""]
  return "\n".join(lines)


def write_all(results: dict, workdir: str) -> None:
  loss_vs_length(results, os.path.join(workdir, "loss_vs_length.png"))
  per_position(results, os.path.join(workdir, "loss_by_position.png"))
  atomic_write(os.path.join(workdir, "results.md"),
               f"# Length extrapolation (trained at {results['train_length']} tokens, "
               f"{results.get('dataset', '?')})\n\n" + table(results)
               + experiment_results.footer(results))
