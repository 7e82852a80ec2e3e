"""publish19.py SRC DEST: publish a probes gather (SRC, e.g. /work/runs/probes/grammar_corpus) over
the committed results (DEST, experiments/probes/results/grammar_corpus), keeping what the
regeneration drops: the hand-kept header comment (first line; edit it afterwards to say what the
new gather was) and the "## Ablation: the results before issue 19's fixes" section to the end.
Copies results.json, results.md and the PNGs; prints what it wrote."""

import glob
import os
import shutil
import sys

ABLATION = "## Ablation: the results before issue 19's fixes"


def main(src: str, dest: str) -> None:
  with open(os.path.join(dest, "results.md")) as f:
    old = f.read()
  if not old.startswith("<!--") or ABLATION not in old:
    sys.exit(f"{dest}/results.md has no header comment or no '{ABLATION}' section: publish by hand")
  header, ablation = old.split("\n", 1)[0], old[old.index(ABLATION):]
  with open(os.path.join(src, "results.md")) as f:
    new = f.read()
  if ABLATION in new or new.startswith("<!--"):
    sys.exit(f"{src}/results.md already holds a header or the ablation: nothing to merge")
  text = header + "\n" + new.rstrip("\n") + "\n\n" + ablation
  for path in [os.path.join(src, "results.json")] + sorted(glob.glob(os.path.join(src, "*.png"))):
    shutil.copy2(path, dest)
    print("copied", os.path.basename(path))
  with open(os.path.join(dest, "results.md"), "w") as f:
    f.write(text)
  print(f"wrote results.md ({len(text.splitlines())} lines; header and ablation kept)")


if __name__ == "__main__":
  if len(sys.argv) != 3:
    sys.exit(__doc__)
  main(*sys.argv[1:])
