"""copy_unchanged_runs.py OLD_DESIGN NEW_DESIGN OLD_DIR NEW_DIR: copy into NEW_DIR every finished
run of OLD_DIR (a configs/scaling.py:design=OLD_DESIGN sweep) whose overrides NEW_DESIGN declares
unchanged (runs new to NEW_DESIGN train), after checking each against the run's config.json;
runs NEW_DIR holds are kept.
Run it from a frozen checkout with PYTHONPATH set to it (scaling_deep.sh does)."""
import json
import os
import shutil
import sys

from configs import scaling
from launch import sweep

old_design, new_design, old, new = sys.argv[1:]
before = {r["name"]: r for r in sweep.expand(scaling.get_config(f"design={old_design}"))}
os.makedirs(new, exist_ok=True)
copied = 0
for r in sweep.expand(scaling.get_config(f"design={new_design}")):
  src, dst = os.path.join(old, r["name"]), os.path.join(new, r["name"])
  old_run = before.get(r["name"])  # None: a run the old design does not have
  if old_run is None or r["overrides"] != old_run["overrides"] or os.path.exists(dst):
    continue
  config = json.load(open(os.path.join(src, "config.json")))
  for key, value in r["overrides"].items():
    section, field = key.split(".")
    assert config[section][field] == value, (r["name"], key, config[section][field], value)
  assert sweep.is_finished(src), src
  shutil.copytree(src, dst)
  copied += 1
print(f"copied {copied} finished runs of {old_design}")
