#!/usr/bin/env bash
# scaling_deep.sh PARALLEL: issue 18's extended_deep grid (configs/scaling.py:design=extended_deep)
# from the frozen 624876f. Its 46 runs whose overrides equal the extended grid's are copied from
# that grid's workdir (checked against each run's config.json); the 14 with new shapes train.
# Resumable: rerun it; finished runs are skipped, interrupted ones resume from their checkpoint.
set -u
F=/work/frozen-624876f
E=/work/runs/scaling/grammar_corpus/extended
W=/work/runs/scaling/grammar_corpus/extended_deep
cd "$F"
export PYTHONPATH="$F"
echo "$(date -u) scaling_deep start (parallel $1)"
/work/main/.venv/bin/python - "$E" "$W" <<'PY'
import json, os, shutil, sys
from configs import scaling
from launch import sweep
old, new = sys.argv[1:]
ext = {r["name"]: r for r in sweep.expand(scaling.get_config("design=extended"))}
os.makedirs(new, exist_ok=True)
copied = 0
for r in sweep.expand(scaling.get_config("design=extended_deep")):
  src, dst = os.path.join(old, r["name"]), os.path.join(new, r["name"])
  if r["overrides"] != ext[r["name"]]["overrides"] or os.path.exists(dst):
    continue
  config = json.load(open(os.path.join(src, "config.json")))
  for key, value in r["overrides"].items():
    section, field = key.split(".")
    assert config[section][field] == value, (r["name"], key, config[section][field], value)
  assert sweep.is_finished(src), src
  shutil.copytree(src, dst)
  copied += 1
print(f"copied {copied} finished runs of the extended grid")
PY
nice -n 19 /work/main/.venv/bin/python -m launch.local --config configs/scaling.py:design=extended_deep \
  --workdir "$W" --parallel "$1"
echo "$(date -u) scaling_deep grid rc=$?"
(cd /work/main && flock /work/runs/records.lock .venv/bin/python -m experiments.records save /work/runs experiments/records)
echo "$(date -u) scaling_deep records saved"
