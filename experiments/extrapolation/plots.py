"""Plots and the markdown table of an extrapolation results.json."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import results as experiment_results  # noqa: E402


def _series(table: dict, lengths):
  return [table.get(str(n)) for n in lengths]


def loss_vs_length(results: dict, path: str) -> str:
  lengths = results["eval_lengths"]
  L = results["train_length"]
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True, layout="constrained")
  for ax, key, title in [(axes[0], "loss", "non-overlapping windows"),
                         (axes[1], "loss_sliding", "sliding window (stride = length / 2)")]:
    for variant, table in results[key].items():
      ys = _series(table, lengths)
      xs = [n for n, y in zip(lengths, ys) if y is not None]
      ys = [y for y in ys if y is not None]
      style = "--" if "+" in variant else "-"
      ax.plot(xs, ys, style, marker="o", label=variant)
    ax.axvline(L, color="gray", linestyle=":", label=f"training length {L}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("mean next-token loss (nats/token)")
  axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=9)
  fig.suptitle(f"Length extrapolation on {results.get('dataset', '?')} "
               f"(trained at {L} tokens)")
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
    n = len(curve) // bucket * bucket
    smooth = curve[:n].reshape(-1, bucket).mean(axis=1)
    xs = np.arange(len(smooth)) * bucket + bucket / 2
    ax.plot(xs, smooth, "--" if "+" in variant else "-", label=f"{variant} (to {len(curve)})")
  ax.axvline(L, color="gray", linestyle=":", label=f"training length {L}")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("position in the evaluation window (tokens)")
  ax.set_ylabel(f"mean loss (nats/token, {bucket}-token buckets)")
  ax.set_title("Loss by position at the longest applicable evaluation length")
  ax.grid(alpha=0.3)
  ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=9)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


def table(results: dict) -> str:
  lengths = results["eval_lengths"]
  lines = []
  for key, title in [("loss", "Non-overlapping windows"),
                     ("loss_sliding", "Sliding window (stride = length / 2)")]:
    lines += [f"### {title}: mean loss in nats/token (perplexity)", "",
              "| scheme | " + " | ".join(str(n) for n in lengths) + " |",
              "| --- | " + " | ".join("---" for _ in lengths) + " |"]
    for variant, row in results[key].items():
      cells = [f"{v:.3f} ({np.exp(v):.2f})" if v is not None else "not applicable"
               for v in _series(row, lengths)]
      lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)


def write_all(results: dict, workdir: str) -> None:
  loss_vs_length(results, os.path.join(workdir, "loss_vs_length.png"))
  per_position(results, os.path.join(workdir, "loss_by_position.png"))
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(f"# Length extrapolation (trained at {results['train_length']} tokens, "
            f"{results.get('dataset', '?')})\n\n")
    f.write(table(results))
    f.write(experiment_results.footer(results))
