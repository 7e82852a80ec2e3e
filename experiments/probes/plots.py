"""Plots and the markdown summary of a probes results.json."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import results as experiment_results  # noqa: E402


def agreement(results: dict, path: str) -> str:
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True, layout="constrained")
  for scheme, r in results["agreement"].items():
    xs = [x for x in sorted(r["by_attractors"], key=int) if r["by_attractors"][x] is not None]
    axes[0].plot([int(x) for x in xs], [r["by_attractors"][x] for x in xs], marker="o",
                 label=scheme)
    ds = sorted(r["by_distance"], key=int)
    axes[1].plot([int(d) for d in ds], [r["by_distance"][d] for d in ds], marker=".",
                 label=scheme)
  axes[0].set_xlabel("attractors between subject and verb")
  axes[0].set_xticks(range(5))
  axes[1].set_xlabel("words between subject and verb")
  axes[0].set_ylabel("accuracy (agreeing verb more probable)")
  for ax in axes:
    ax.axhline(0.5, color="gray", linestyle=":")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
  axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
  fig.suptitle("Subject-verb agreement with attractors (chance = 0.5)")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


def retrieval(results: dict, path: str) -> str:
  ns = sorted({n for r in results["retrieval"].values() for n in r}, key=int)
  fig, axes = plt.subplots(1, len(ns), figsize=(4.6 * len(ns), 4.2), sharey=True,
                           squeeze=False, layout="constrained")
  for ax, n in zip(axes[0], ns):
    for scheme, r in results["retrieval"].items():
      row = r.get(n, {}).get("accuracy_by_position")
      if row is None:
        continue
      ps = sorted(row, key=int)
      ax.plot([int(p) + 1 for p in ps], [row[p] for p in ps], marker="o", label=scheme)
    trained = " (training length)" if int(n) == results["kv_train_pairs"] else ""
    ax.set_title(f"{n} pairs{trained}")
    ax.set_xlabel("position of the queried pair (1 = first)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("exact-match retrieval accuracy")
  axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
  fig.suptitle("Lost in the middle: key-value retrieval by position of the queried pair")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


def summary(results: dict) -> str:
  lines = ["# Probes", "", "## Agreement with attractors (accuracy)", "",
           "| scheme | " + " | ".join(f"{k} attractors" for k in range(5)) + " |",
           "| --- |" + " --- |" * 5]
  for scheme, r in results["agreement"].items():
    cell = lambda v: "n/a (too long)" if v is None else f"{v:.2f}"
    lines.append(f"| {scheme} | " + " | ".join(cell(r["by_attractors"][str(k)])
                                               for k in range(5)) + " |")
  lines += ["", "## Lost in the middle (exact-match accuracy, mean over positions; U-shape: "
            "both ends beat the middle by > 0.05)", "",
            "| scheme | pairs | mean accuracy | ends | middle | U-shaped |",
            "| --- | --- | --- | --- | --- | --- |"]
  for scheme, r in results["retrieval"].items():
    for n, row in r.items():
      if "accuracy_by_position" not in row:
        lines.append(f"| {scheme} | {n} | not applicable | | | |")
        continue
      acc = list(row["accuracy_by_position"].values())
      shape = results["retrieval_shape"][scheme][n]
      lines.append(f"| {scheme} | {n} | {sum(acc) / len(acc):.2f} | {shape['ends']:.2f} | "
                   f"{shape['middle']:.2f} | {shape['u_shaped']} |")
  maps = results["attention_maps"]
  lines += ["", f"## Attention maps ({maps['scheme']} model)", "",
            f"Sentence: \"{maps['sentence']}\"; PNGs: " + ", ".join(maps["pngs"]), "",
            "| layer | head | kind | score |", "| --- | --- | --- | --- |"]
  for h in maps["notable_heads"]:
    lines.append(f"| {h['layer']} | {h['head']} | {h['kind']} | {h['score']:.2f} |")
  if not maps["notable_heads"]:
    lines.append("| - | - | no head passed the thresholds | - |")
  # The strongest head of each kind, notable or not, so a null result still says how close.
  lines += ["", f"Strongest head of each kind over {len(maps['census']['previous_token'])} "
            "layers (census over grammar items; thresholds 0.5, 0.5, 0.05):", "",
            "| measure | layer | head | score |", "| --- | --- | --- | --- |"]
  for name, census in maps["census"].items():
    scores = np.asarray(census, np.float64)
    li, h = np.unravel_index(np.argmax(scores), scores.shape)
    lines.append(f"| {name} | {li} | {h} | {scores[li, h]:.2f} |")
  return "\n".join(lines) + "\n"


def write_all(results: dict, workdir: str) -> None:
  agreement(results, os.path.join(workdir, "agreement.png"))
  retrieval(results, os.path.join(workdir, "retrieval.png"))
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(summary(results))
    f.write(experiment_results.footer(results))
