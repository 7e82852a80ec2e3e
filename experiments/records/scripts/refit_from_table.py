"""Rebuild a finished scaling sweep's run directories from its published files, to refit it.

  python experiments/records/scripts/refit_from_table.py RESULTS_DIR PREFIX OUT_DIR

The corrected grid (issue 18) finished on a machine that went away before experiments/records
existed: only its published sweep.json, results.md and fit.json survive. Everything
experiments.scaling.fit reads from a run is in sweep.json (shape, steps, tokens, parameter and
FLOP counts, seed) except the final eval loss, which results.md gives to 4 decimals, and the
loss floor, which fit.json gives. This writes OUT_DIR/sweep.json and, per run,
OUT_DIR/<run>/summary.json and config.json, so that `python -m experiments.scaling.fit
--workdir OUT_DIR ...` refits it (without the training curves, which only the frontier plot
draws). The losses' rounding (at most 5e-5 nats) is far below their seed spread; the refit's
point estimates are compared with the published fit.json's to show it.
"""

import json
import os
import sys


def read_losses(results_md: str) -> dict:
  """run name -> eval loss, from the per-run table of a fit's results.md."""
  losses, column = {}, None
  with open(results_md) as f:
    for line in f:
      cells = [c.strip() for c in line.strip().strip("|").split("|")]
      if line.startswith("| run |"):
        column = cells.index("eval loss")
      elif column is not None and line.startswith("| ") and not line.startswith("|---"):
        losses[cells[0]] = float(cells[column])
      elif column is not None and not line.startswith("|"):
        column = None
  return losses


def main(results_dir: str, prefix: str, out: str) -> None:
  with open(os.path.join(results_dir, f"{prefix}sweep.json")) as f:
    sweep = json.load(f)
  with open(os.path.join(results_dir, f"{prefix}fit.json")) as f:
    dataset = json.load(f)["dataset"]
  floor = dataset["loss_floor"]
  losses = read_losses(os.path.join(results_dir, f"{prefix}results.md"))
  missing = [r["name"] for r in sweep["runs"] if r["name"] not in losses]
  if missing:
    raise SystemExit(f"results.md has no eval loss for {missing}; is it this sweep's table?")
  if os.path.exists(out) and os.listdir(out):
    raise SystemExit(f"{out} is not empty; give a new directory")
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "sweep.json"), "w") as f:
    json.dump(sweep, f, indent=1)
  for r in sweep["runs"]:
    o = r["overrides"]
    summary = dict(final_eval_loss=losses[r["name"]], step=o["train.steps"], tokens=r["tokens"],
                   params_total=r["params_total"],
                   params_non_embedding=r["params_non_embedding"], flops=r["flops"],
                   flops_total=r["flops_total"], loss_floor=floor,
                   config={"train.seed": o.get("train.seed", 0),
                           "data.doc_sentences": dataset.get("doc_sentences")},
                   rebuilt_from=f"{results_dir}/{prefix}results.md and {prefix}sweep.json")
    os.makedirs(os.path.join(out, r["name"]))
    with open(os.path.join(out, r["name"], "summary.json"), "w") as f:
      json.dump(summary, f, indent=1)
    with open(os.path.join(out, r["name"], "config.json"), "w") as f:
      json.dump({"model": {"num_layers": o["model.num_layers"]}}, f)
  print(f"rebuilt {len(sweep['runs'])} runs in {out} (loss floor {floor})")


if __name__ == "__main__":
  if len(sys.argv) != 4:
    raise SystemExit(__doc__.split("\n\n")[1])
  main(*sys.argv[1:])
